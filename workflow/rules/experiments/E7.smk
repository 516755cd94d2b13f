# E7: fine-tuning the zoo's cGAN with an MMD loss: FedSGD, FedAvg, centralized, none,
# with the same generator steps and latent batches; FedSGD is central training.
from distrank.experiments.e7_mmd_finetuning import (
    NONE,
    TRAINED,
    evaluation_models,
    reuses_features,
    step_tags,
)

E7 = config["experiments"]["E7"]
# The loss's embedding is EfficientNet-Lite0: its reference features come from the
# feature step when that is the study's extractor, else the job embeds the images.
E7_REFERENCE = (
    {"reference_features": f"{RESULTS}/features/reference.npz"}
    if reuses_features(config)
    else {"reference_images": f"{RESULTS}/images/reference.npz"}
)


# A simulation of the federation in one job, which holds every client's features (hence
# _centralized, the privacy boundary's name); inside it each client's loss reads its own
# rows only. The resume state lives in training/E7/<method>.resume/, outside the declared outputs
# (which Snakemake deletes when a job fails): a killed job, rerun, continues after its
# last evaluation point and ends with the same checkpoints (bit for bit on the CPU).
rule e7_finetune_centralized:
    input:
        **E7_REFERENCE,
        state=f"{RESULTS}/zoo/cgan.pt",
        manifest=f"{RESULTS}/clients/{E7['partition']}/manifest.csv",
    output:
        bundle=f"{RESULTS}/training/E7/{{method}}.pt",
    log:
        f"{LOGS}/e7_finetune_centralized/{{method}}.log",
        cost=f"{BENCH}/e7_finetune_centralized/{{method}}.tsv",
    wildcard_constraints:
        method=one_of(TRAINED),
    conda:
        "../../../envs/torch.yaml"
    threads: res("e7_finetune_centralized", "threads")
    resources:
        mem_mb=res("e7_finetune_centralized", "mem_mb"),
        runtime=res("e7_finetune_centralized", "runtime"),
        gpu=res("e7_finetune_centralized", "gpus"),
    params:
        settings=E7,
        seed=config["seed"],
        checkpoint_dir=lambda wc: f"{RESULTS}/training/E7/{wc.method}.resume",
        device=device("e7_finetune_centralized"),
    script:
        "../../../scripts/experiment.py"


rule e7_checkpoint_features:
    input:
        bundle=f"{RESULTS}/training/E7/{{method}}.pt",
    output:
        [f"{RESULTS}/features/model_e7-{{method}}-{tag}.npz" for tag in step_tags(E7)],
    log:
        f"{LOGS}/e7_checkpoint_features/{{method}}.log",
        cost=f"{BENCH}/e7_checkpoint_features/{{method}}.tsv",
    wildcard_constraints:
        method=one_of(TRAINED),
    conda:
        "../../../envs/torch.yaml"
    threads: res("e7_checkpoint_features", "threads")
    resources:
        mem_mb=res("e7_checkpoint_features", "mem_mb"),
        runtime=res("e7_checkpoint_features", "runtime"),
        gpu=res("e7_checkpoint_features", "gpus"),
    params:
        models=lambda wc: [
            m for m, (method, _) in evaluation_models(E7).items() if method == wc.method
        ],
        features=config["features"],
        n_samples=E7["n_samples"],
        seed=config["seed"],
        image_dir=f"{RESULTS}/training/E7/images",
        device=device("e7_checkpoint_features"),
    script:
        "../../../scripts/checkpoint_features.py"


# The start of every run (step 0) and the run without fine-tuning: the zoo's cGAN,
# sampled like the checkpoints.
rule e7_start_features:
    input:
        state=f"{RESULTS}/zoo/cgan.pt",
    output:
        f"{RESULTS}/features/model_{NONE}.npz",
    log:
        f"{LOGS}/e7_start_features.log",
        cost=f"{BENCH}/e7_start_features.tsv",
    conda:
        "../../../envs/torch.yaml"
    threads: res("e7_checkpoint_features", "threads")
    resources:
        mem_mb=res("e7_checkpoint_features", "mem_mb"),
        runtime=res("e7_checkpoint_features", "runtime"),
        gpu=res("e7_checkpoint_features", "gpus"),
    params:
        models=[NONE],
        features=config["features"],
        n_samples=E7["n_samples"],
        seed=config["seed"],
        image_dir=f"{RESULTS}/training/E7/images",
        device=device("e7_checkpoint_features"),
    script:
        "../../../scripts/checkpoint_features.py"


localrules:
    E7,


rule E7:
    input:
        **experiment_scores("E7"),
    output:
        **experiment_outputs("E7"),
    log:
        f"{LOGS}/E7.log",
        cost=f"{BENCH}/E7.tsv",
    conda:
        "../../../envs/core.yaml"
    params:
        **experiment_params("E7"),
    script:
        "../../../scripts/experiment.py"
