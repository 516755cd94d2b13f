# The models' images: generators trained on the reference pool, controlled
# degradations of held-out real images whose true order is known, published
# checkpoints (StyleGAN2-ADA, EDM) and published or your own samples.


rule train_generator:
    input:
        f"{RESULTS}/images/reference.npz",
    output:
        f"{RESULTS}/zoo/{{family}}.pt",
    log:
        f"{LOGS}/train_generator/{{family}}.log",
        cost=f"{BENCH}/train_generator/{{family}}.tsv",
    wildcard_constraints:
        family=one_of(ZOO_TRAINED),
    conda:
        "../../envs/torch.yaml"
    threads: res("train_generator", "threads")
    resources:
        mem_mb=res("train_generator", "mem_mb"),
        runtime=res("train_generator", "runtime"),
    params:
        family=lambda wc: wc.family,
        settings=lambda wc: ZOO_TRAINED[wc.family],
        seed=config["seed"],
    script:
        "../../scripts/train_generator.py"


# What made a trained state (distrank.zoo.pretrained.provenance), its wall time from the
# training job's cost file; made for the `pretrain` target only, so that a
# study's results stay the same bytes run after run.
rule zoo_provenance:
    input:
        state=f"{RESULTS}/zoo/{{family}}.pt",
        benchmark=f"{BENCH}/train_generator/{{family}}.tsv",
        images=f"{RESULTS}/images/reference.npz",
    output:
        f"{RESULTS}/zoo/{{family}}.json",
    log:
        f"{LOGS}/zoo_provenance/{{family}}.log",
        cost=f"{BENCH}/zoo_provenance/{{family}}.tsv",
    wildcard_constraints:
        family=one_of(ZOO_TRAINED),
    localrule: True
    conda:
        "../../envs/torch.yaml"
    params:
        settings=lambda wc: ZOO_TRAINED[wc.family],
        seed=config["seed"],
        threads=res("train_generator", "threads"),
        images=config["reference"],
    script:
        "../../scripts/zoo_provenance.py"


# A shipped checkpoint (zoo.<family>.pretrained) enters the DAG only through its
# sha256 pin; it is never retrained.
rule pretrained_generator:
    input:
        lambda wc: ZOO_PRETRAINED[wc.family]["pretrained"],
    output:
        f"{RESULTS}/zoo/{{family}}.pt",
    log:
        f"{LOGS}/pretrained_generator/{{family}}.log",
        cost=f"{BENCH}/pretrained_generator/{{family}}.tsv",
    wildcard_constraints:
        family=one_of(ZOO_PRETRAINED),
    localrule: True
    conda:
        "../../envs/core.yaml"
    params:
        sha256=lambda wc: ZOO_PRETRAINED[wc.family]["sha256"],
    script:
        "../../scripts/pretrained_generator.py"


# The generators trained in the DAG with their provenance (configs/zoo-pretrain.yaml:
# the checkpoints the default study ships in pretrained/).
rule pretrain:
    input:
        expand(f"{RESULTS}/zoo/{{family}}.{{ext}}", family=ZOO_TRAINED, ext=["pt", "json"]),


rule generate:
    input:
        unpack(model_inputs),
    output:
        f"{RESULTS}/images/model_{{model}}.npz",
    log:
        f"{LOGS}/generate/{{model}}.log",
        cost=f"{BENCH}/generate/{{model}}.tsv",
    conda:
        "../../envs/torch.yaml"
    threads: res("generate", "threads")
    resources:
        mem_mb=res("generate", "mem_mb"),
        runtime=res("generate", "runtime"),
        gpu=lambda wc: res("generate", "gpus") if MODELS[wc.model]["kind"] == "checkpoint" else 0,
    params:
        spec=lambda wc: MODELS[wc.model],
        n_samples=config["n_samples"],
        seed=config["seed"],
        paths=model_source_paths,
        batch_size=config["generation"]["batch_size"],
        device=device("generate"),
        trust_pickles=config["trust_pickles"],
    script:
        "../../scripts/generate.py"
