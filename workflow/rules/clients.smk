# Partition the reference pool into clients; each client then holds its own file.


rule partition:
    input:
        f"{RESULTS}/features/reference.npz",
    output:
        f"{RESULTS}/clients/{{partition}}/manifest.csv",
    log:
        f"{LOGS}/partition/{{partition}}.log",
        cost=f"{BENCH}/partition/{{partition}}.tsv",
    conda:
        "../../envs/core.yaml"
    resources:
        mem_mb=res("partition", "mem_mb"),
        runtime=res("partition", "runtime"),
    params:
        scheme=lambda wc: config["partitions"][wc.partition],
        seed=config["seed"],
    script:
        "../../scripts/partition.py"


rule client_data:
    input:
        features=f"{RESULTS}/features/reference.npz",
        manifest=f"{RESULTS}/clients/{{partition}}/manifest.csv",
    output:
        f"{RESULTS}/clients/{{partition}}/{{client}}.npz",
    log:
        f"{LOGS}/client_data/{{partition}}/{{client}}.log",
        cost=f"{BENCH}/client_data/{{partition}}/{{client}}.tsv",
    conda:
        "../../envs/core.yaml"
    resources:
        mem_mb=res("client_data", "mem_mb"),
        runtime=res("client_data", "runtime"),
    script:
        "../../scripts/client_data.py"
