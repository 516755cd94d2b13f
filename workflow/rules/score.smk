# The privacy boundary: a client job reads only its own features and every model's
# features (what a real client receives); the server averages the clients' score
# files; only the *_centralized rules read pooled reference data.
localrules:
    average_clients,


rule score_client:
    input:
        client=f"{RESULTS}/clients/{{partition}}/{{client}}.npz",
        models=scored_features,
    output:
        f"{RESULTS}/scores/{{partition}}/clients/{{client}}.json",
    log:
        f"{LOGS}/score_client/{{partition}}/{{client}}.log",
        cost=f"{BENCH}/score_client/{{partition}}/{{client}}.tsv",
    conda:
        "../../envs/core.yaml"
    resources:
        mem_mb=res("score_client", "mem_mb"),
        runtime=res("score_client", "runtime"),
    params:
        models=lambda wc: SCORED[wc.partition],
        metrics=config["metrics"],
    script:
        "../../scripts/score_client.py"


rule average_clients:
    input:
        client_score_files,
    output:
        f"{RESULTS}/scores/{{partition}}/avg.json",
    log:
        f"{LOGS}/average_clients/{{partition}}.log",
        cost=f"{BENCH}/average_clients/{{partition}}.tsv",
    conda:
        "../../envs/core.yaml"
    params:
        weights=config["metrics"]["weights"],
    script:
        "../../scripts/average_clients.py"


rule score_all_centralized:
    input:
        reference=f"{RESULTS}/features/reference.npz",
        manifest=f"{RESULTS}/clients/{{partition}}/manifest.csv",
        models=scored_features,
    output:
        f"{RESULTS}/scores/{{partition}}/all_centralized.json",
    log:
        f"{LOGS}/score_all_centralized/{{partition}}.log",
        cost=f"{BENCH}/score_all_centralized/{{partition}}.tsv",
    conda:
        "../../envs/core.yaml"
    resources:
        mem_mb=res("score_all_centralized", "mem_mb"),
        runtime=res("score_all_centralized", "runtime"),
    params:
        models=lambda wc: SCORED[wc.partition],
        metrics=config["metrics"],
    script:
        "../../scripts/score_all_centralized.py"
