# E5: scores along federated GAN training (FedAvg across the clients, and central with
# the same steps), a checkpoint after every round; the KD gap is the same at each one.
from pathlib import Path

from distrank.experiments.e5_federated_training import RUNS, checkpoint_models, round_tags

E5 = config["experiments"]["E5"]


# A simulation of the federation in one job, which holds every client's images (hence
# _centralized, the privacy boundary's name); inside it each client trains on its own
# rows only. The resume state lives in training/E5/<run>.resume/, outside the declared outputs,
# which Snakemake deletes when a job fails: a killed job, rerun, continues after its
# last round and ends with the same checkpoints (bit for bit on the CPU).
rule e5_train_centralized:
    input:
        images=f"{RESULTS}/images/reference.npz",
        manifest=f"{RESULTS}/clients/{E5['partition']}/manifest.csv",
    output:
        bundle=f"{RESULTS}/training/E5/{{run}}.pt",
    log:
        f"{LOGS}/e5_train_centralized/{{run}}.log",
        cost=f"{BENCH}/e5_train_centralized/{{run}}.tsv",
    wildcard_constraints:
        run=one_of(RUNS),
    conda:
        "../../../envs/torch.yaml"
    threads: res("e5_train_centralized", "threads")
    resources:
        mem_mb=res("e5_train_centralized", "mem_mb"),
        runtime=res("e5_train_centralized", "runtime"),
        gpu=res("e5_train_centralized", "gpus"),
    params:
        settings=E5,
        seed=config["seed"],
        checkpoint_dir=lambda wc: f"{RESULTS}/training/E5/{wc.run}.resume",
        device=device("e5_train_centralized"),
    script:
        "../../../scripts/experiment.py"


rule e5_checkpoint_features:
    input:
        bundle=f"{RESULTS}/training/E5/{{run}}.pt",
    output:
        [f"{RESULTS}/features/model_e5-{{run}}-{tag}.npz" for tag in round_tags(E5)],
        samples=[
            f"{RESULTS}/training/E5/images/model_e5-{{run}}-{tag}.npz"
            for tag in round_tags(E5)[:: len(round_tags(E5)) - 1]
        ],
    log:
        f"{LOGS}/e5_checkpoint_features/{{run}}.log",
        cost=f"{BENCH}/e5_checkpoint_features/{{run}}.tsv",
    wildcard_constraints:
        run=one_of(RUNS),
    conda:
        "../../../envs/torch.yaml"
    threads: res("e5_checkpoint_features", "threads")
    resources:
        mem_mb=res("e5_checkpoint_features", "mem_mb"),
        runtime=res("e5_checkpoint_features", "runtime"),
        gpu=res("e5_checkpoint_features", "gpus"),
    params:
        models=lambda wc: [m for m, (run, _) in checkpoint_models(E5).items() if run == wc.run],
        features=config["features"],
        n_samples=E5["n_samples"],
        seed=config["seed"],
        image_dir=lambda wc, output: str(Path(output.samples[0]).parent),
        device=device("e5_checkpoint_features"),
    script:
        "../../../scripts/checkpoint_features.py"


localrules:
    E5,


rule E5:
    input:
        **experiment_scores("E5"),
        samples=[  # the first and last checkpoints' images of both runs
            f"{RESULTS}/training/E5/images/model_e5-{run}-{tag}.npz"
            for run in RUNS
            for tag in round_tags(E5)[:: len(round_tags(E5)) - 1]
        ],
    output:
        **experiment_outputs("E5"),
    log:
        f"{LOGS}/E5.log",
        cost=f"{BENCH}/E5.tsv",
    conda:
        "../../../envs/core.yaml"
    params:
        **experiment_params("E5"),
    script:
        "../../../scripts/experiment.py"
