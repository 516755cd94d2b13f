# The privacy boundary: a client job reads only its own features and the model's;
# the server averages the clients' score files; only the *_centralized rules read
# pooled reference data.


rule score_client:
    input:
        client=f"{RESULTS}/clients/{{partition}}/{{client}}.npz",
        model=f"{RESULTS}/features/model_{{model}}.npz",
    output:
        f"{RESULTS}/scores/{{partition}}/{{model}}/{{client}}.json",
    params:
        metrics=config["metrics"],
    log:
        f"{LOGS}/score_client/{{partition}}/{{model}}/{{client}}.log",
    benchmark:
        f"{BENCH}/score_client/{{partition}}/{{model}}/{{client}}.tsv"
    resources:
        mem_mb=res("score_client", "mem_mb"),
        runtime=res("score_client", "runtime"),
    conda:
        "../../envs/core.yaml"
    script:
        "../../scripts/score_client.py"


rule average_clients:
    input:
        client_score_files,
    output:
        f"{RESULTS}/scores/{{partition}}/{{model}}/avg.json",
    params:
        weights=config["metrics"]["weights"],
    log:
        f"{LOGS}/average_clients/{{partition}}/{{model}}.log",
    conda:
        "../../envs/core.yaml"
    script:
        "../../scripts/average_clients.py"


rule score_all_centralized:
    input:
        reference=f"{RESULTS}/features/reference.npz",
        manifest=f"{RESULTS}/clients/{{partition}}/manifest.csv",
        model=f"{RESULTS}/features/model_{{model}}.npz",
    output:
        f"{RESULTS}/scores/{{partition}}/{{model}}/all_centralized.json",
    params:
        metrics=config["metrics"],
    log:
        f"{LOGS}/score_all_centralized/{{partition}}/{{model}}.log",
    benchmark:
        f"{BENCH}/score_all_centralized/{{partition}}/{{model}}.tsv"
    resources:
        mem_mb=res("score_all_centralized", "mem_mb"),
        runtime=res("score_all_centralized", "runtime"),
    conda:
        "../../envs/core.yaml"
    script:
        "../../scripts/score_all_centralized.py"
