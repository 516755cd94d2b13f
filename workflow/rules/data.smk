# Real images: the reference pool (train split) and held-out real images (test split).


rule real_images:
    output:
        f"{RESULTS}/images/{{subset}}.npz",
    params:
        spec=lambda wc: config[wc.subset],
        seed=config["seed"],
    log:
        f"{LOGS}/real_images/{{subset}}.log",
    benchmark:
        f"{BENCH}/real_images/{{subset}}.tsv"
    wildcard_constraints:
        subset="reference|heldout",
    resources:
        mem_mb=res("real_images", "mem_mb"),
        runtime=res("real_images", "runtime"),
    conda:
        "../../envs/core.yaml"
    script:
        "../../scripts/real_images.py"
