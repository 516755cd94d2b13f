# Partition the reference pool into clients; each client then holds its own file.


rule partition:
    input:
        f"{RESULTS}/features/reference.npz",
    output:
        f"{RESULTS}/clients/{{partition}}/manifest.csv",
    params:
        scheme=lambda wc: config["partitions"][wc.partition],
        seed=config["seed"],
    log:
        f"{LOGS}/partition/{{partition}}.log",
    benchmark:
        f"{BENCH}/partition/{{partition}}.tsv"
    resources:
        mem_mb=res("partition", "mem_mb"),
        runtime=res("partition", "runtime"),
    conda:
        "../../envs/core.yaml"
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
    resources:
        mem_mb=res("client_data", "mem_mb"),
        runtime=res("client_data", "runtime"),
    conda:
        "../../envs/core.yaml"
    script:
        "../../scripts/client_data.py"
