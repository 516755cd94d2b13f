# E4: a diversity knob on variance-limited clients; FD_avg and FD_all pick different knobs.
from distrank.experiments.e4_diversity_sweep import (
    SIMULATED,
    partition_classes,
    sweep_inputs,
    sweep_models,
)


localrules:
    E4,


E4_SETTINGS = config["experiments"]["E4"]
E4_MODELS = sweep_models(E4_SETTINGS)
E4_IMAGE_MODELS = [m for m, s in E4_MODELS.items() if s["spec"]["kind"] != SIMULATED]


# One job makes every sweep model's images and features (one extractor load).
rule e4_sweep_models:
    input:
        **sweep_inputs(E4_SETTINGS, model_files, f"{RESULTS}/features/heldout.npz"),
    output:
        images=[f"{RESULTS}/E4/images/model_{m}.npz" for m in E4_IMAGE_MODELS],
        features=model_features(E4_MODELS),
    log:
        f"{LOGS}/e4_sweep_models.log",
    benchmark:
        f"{BENCH}/e4_sweep_models.tsv"
    conda:
        "../../../envs/torch.yaml"
    threads: res("e4_sweep_models", "threads")
    resources:
        mem_mb=res("e4_sweep_models", "mem_mb"),
        runtime=res("e4_sweep_models", "runtime"),
        gpu=res("e4_sweep_models", "gpus"),
    params:
        settings=E4_SETTINGS,
        models=list(E4_MODELS),
        image_models=E4_IMAGE_MODELS,
        n_samples=E4_SETTINGS.get("n_samples", config["n_samples"]),
        classes=partition_classes(config["partitions"][E4_SETTINGS["partition"]]),
        features=config["features"],
        seed=config["seed"],
        batch_size=config["generation"]["batch_size"],
        device=device("e4_sweep_models"),
        trust_pickles=config["trust_pickles"],
    script:
        "../../../scripts/experiment.py"


rule E4:
    input:
        **experiment_scores("E4"),
        images=[f"{RESULTS}/E4/images/model_{m}.npz" for m in E4_IMAGE_MODELS],
    output:
        **experiment_outputs("E4"),
    log:
        f"{LOGS}/E4.log",
    benchmark:
        f"{BENCH}/E4.tsv"
    conda:
        "../../../envs/core.yaml"
    params:
        **experiment_params("E4"),
    script:
        "../../../scripts/experiment.py"
