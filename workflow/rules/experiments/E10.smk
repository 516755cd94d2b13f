# E10: bootstrap intervals of adjacent-pair margins and of Kendall tau, on E1's zoo.
localrules:
    E10,


E10_SETTINGS = config["experiments"]["E10"]
E10_MODELS = list(config["models"])


rule e10_bootstrap_centralized:
    input:
        reference=f"{RESULTS}/features/reference.npz",
        manifest=f"{RESULTS}/clients/{E10_SETTINGS['partition']}/manifest.csv",
        models=model_features(E10_MODELS),
    output:
        pairs=f"{RESULTS}/E10/pairs.csv",
        tau=f"{RESULTS}/E10/tau.csv",
    log:
        f"{LOGS}/e10_bootstrap_centralized.log",
        cost=f"{BENCH}/e10_bootstrap_centralized.tsv",
    conda:
        "../../../envs/core.yaml"
    threads: res("e10_bootstrap_centralized", "threads")
    resources:
        mem_mb=res("e10_bootstrap_centralized", "mem_mb"),
        runtime=res("e10_bootstrap_centralized", "runtime"),
    params:
        models=E10_MODELS,
        settings=E10_SETTINGS,
        metrics=config["metrics"],
        seed=config["seed"],
        device=device("e10_bootstrap_centralized"),
    script:
        "../../../scripts/experiment.py"


rule E10:
    input:
        pairs=f"{RESULTS}/E10/pairs.csv",
        tau=f"{RESULTS}/E10/tau.csv",
    output:
        **experiment_outputs("E10"),
    log:
        f"{LOGS}/E10.log",
        cost=f"{BENCH}/E10.tsv",
    conda:
        "../../../envs/core.yaml"
    params:
        **experiment_params("E10"),
    script:
        "../../../scripts/experiment.py"
