# E4: a diversity knob on variance-limited clients; FD_avg and FD_all pick different knobs.
from distrank.experiments.e4_diversity_sweep.steps import partition_classes, sweep_inputs
from distrank.experiments.e4_diversity_sweep.sweep import FEATURE_KINDS, FITTED, sweep_models


localrules:
    E4,


E4_SETTINGS = config["experiments"]["E4"]
E4_MODELS = sweep_models(E4_SETTINGS)
E4_KINDS = {m: s["spec"]["kind"] for m, s in E4_MODELS.items()}
E4_IMAGE_MODELS = [m for m, kind in E4_KINDS.items() if kind not in FEATURE_KINDS]
E4_FITTED_MODELS = [m for m, kind in E4_KINDS.items() if kind == FITTED]
E4_SWEPT_MODELS = [m for m in E4_MODELS if m not in E4_FITTED_MODELS]  # e4_sweep_models'
E4_N_SAMPLES = E4_SETTINGS.get("n_samples", config["n_samples"])
E4_CLIENTS = expand(
    f"{RESULTS}/clients/{E4_SETTINGS['partition']}/{{client}}.npz",
    client=clients(E4_SETTINGS["partition"]),
)


# One job makes every sweep model's images and features (one extractor load).
rule e4_sweep_models:
    input:
        **sweep_inputs(E4_SETTINGS, model_files, f"{RESULTS}/features/heldout.npz"),
    output:
        images=[f"{RESULTS}/E4/images/model_{m}.npz" for m in E4_IMAGE_MODELS],
        features=model_features(E4_SWEPT_MODELS),
    log:
        f"{LOGS}/e4_sweep_models.log",
        cost=f"{BENCH}/e4_sweep_models.tsv",
    conda:
        "../../../envs/torch.yaml"
    threads: res("e4_sweep_models", "threads")
    resources:
        mem_mb=res("e4_sweep_models", "mem_mb"),
        runtime=res("e4_sweep_models", "runtime"),
        gpu=res("e4_sweep_models", "gpus"),
    params:
        settings=E4_SETTINGS,
        models=E4_SWEPT_MODELS,
        image_models=E4_IMAGE_MODELS,
        n_samples=E4_N_SAMPLES,
        classes=partition_classes(config["partitions"][E4_SETTINGS["partition"]]),
        features=config["features"],
        seed=config["seed"],
        batch_size=config["generation"]["batch_size"],
        device=device("e4_sweep_models"),
        trust_pickles=config["trust_pickles"],
    script:
        "../../../scripts/experiment.py"


# The fitted family: drawn from the clients' own Gaussians (reads every client's rows).
rule e4_fitted_centralized:
    input:
        clients=E4_CLIENTS,
    output:
        features=model_features(E4_FITTED_MODELS),
    log:
        f"{LOGS}/e4_fitted_centralized.log",
        cost=f"{BENCH}/e4_fitted_centralized.tsv",
    conda:
        "../../../envs/core.yaml"
    resources:
        mem_mb=res("e4_fitted_centralized", "mem_mb"),
        runtime=res("e4_fitted_centralized", "runtime"),
    params:
        settings=E4_SETTINGS,
        models=E4_FITTED_MODELS,
        n_samples=E4_N_SAMPLES,
        seed=config["seed"],
        weights=config["metrics"]["weights"],
    script:
        "../../../scripts/experiment.py"


# FD of every sweep model in each setting (as scored, PCA, extrapolated), with its terms.
rule e4_fd_centralized:
    input:
        clients=E4_CLIENTS,
        models=model_features(E4_MODELS),
    output:
        fd=f"{RESULTS}/E4/fd.csv",
        theory=f"{RESULTS}/E4/theory.csv",
    log:
        f"{LOGS}/e4_fd_centralized.log",
        cost=f"{BENCH}/e4_fd_centralized.tsv",
    conda:
        "../../../envs/core.yaml"
    threads: res("e4_fd_centralized", "threads")
    resources:
        mem_mb=res("e4_fd_centralized", "mem_mb"),
        runtime=res("e4_fd_centralized", "runtime"),
    params:
        settings=E4_SETTINGS,
        models=list(E4_MODELS),
        seed=config["seed"],
        weights=config["metrics"]["weights"],
    script:
        "../../../scripts/experiment.py"


rule E4:
    input:
        **experiment_scores("E4"),
        images=[f"{RESULTS}/E4/images/model_{m}.npz" for m in E4_IMAGE_MODELS],
        fd=f"{RESULTS}/E4/fd.csv",
        theory=f"{RESULTS}/E4/theory.csv",
    output:
        **experiment_outputs("E4"),
    log:
        f"{LOGS}/E4.log",
        cost=f"{BENCH}/E4.tsv",
    conda:
        "../../../envs/core.yaml"
    params:
        **experiment_params("E4"),
    script:
        "../../../scripts/experiment.py"
