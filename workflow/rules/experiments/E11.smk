# E11 (beyond the paper): one private kernel mean sketch per site against per-score
# releases, secure sums and FD's noised moments, over epsilon.
localrules:
    E11,


E11_SETTINGS = config["experiments"]["E11"]
E11_MODELS = list(config["models"])
E11_INPUTS = {
    "reference": f"{RESULTS}/features/reference.npz",
    "manifest": f"{RESULTS}/clients/{E11_SETTINGS['partition']}/manifest.csv",
    "models": model_features(E11_MODELS),
}


rule e11_sketches_centralized:
    input:
        **E11_INPUTS,
    output:
        sketches=f"{RESULTS}/E11/sketches.npz",
    log:
        f"{LOGS}/e11_sketches_centralized.log",
        cost=f"{BENCH}/e11_sketches_centralized.tsv",
    conda:
        "../../../envs/core.yaml"
    threads: res("e11_sketches_centralized", "threads")
    resources:
        mem_mb=res("e11_sketches_centralized", "mem_mb"),
        runtime=res("e11_sketches_centralized", "runtime"),
    params:
        models=E11_MODELS,
        settings=E11_SETTINGS,
        metrics=config["metrics"],
        seed=config["seed"],
        device=device("e11_sketches_centralized"),
    script:
        "../../../scripts/experiment.py"


rule e11_fd_private:
    input:
        **E11_INPUTS,
    output:
        fd=f"{RESULTS}/E11/fd_draws.npz",
    log:
        f"{LOGS}/e11_fd_private.log",
        cost=f"{BENCH}/e11_fd_private.tsv",
    conda:
        "../../../envs/core.yaml"
    threads: res("e11_fd_private", "threads")
    resources:
        mem_mb=res("e11_fd_private", "mem_mb"),
        runtime=res("e11_fd_private", "runtime"),
    params:
        models=E11_MODELS,
        settings=E11_SETTINGS,
        seed=config["seed"],
    script:
        "../../../scripts/experiment.py"


rule E11:
    input:
        sketches=f"{RESULTS}/E11/sketches.npz",
        fd=f"{RESULTS}/E11/fd_draws.npz",
    output:
        **experiment_outputs("E11"),
    log:
        f"{LOGS}/E11.log",
        cost=f"{BENCH}/E11.tsv",
    conda:
        "../../../envs/core.yaml"
    params:
        **experiment_params("E11"),
    script:
        "../../../scripts/experiment.py"
