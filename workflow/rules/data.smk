# Real images: the reference pool the clients split, and held-out real images.


rule real_images:
    input:
        lambda wc: source_paths(config[wc.subset]["source"]).values(),
    output:
        f"{RESULTS}/images/{{subset}}.npz",
    log:
        f"{LOGS}/real_images/{{subset}}.log",
        cost=f"{BENCH}/real_images/{{subset}}.tsv",
    wildcard_constraints:
        subset="reference|heldout",
    conda:
        "../../envs/core.yaml"
    threads: res("real_images", "threads")  # processes decoding image files
    resources:
        mem_mb=res("real_images", "mem_mb"),
        runtime=res("real_images", "runtime"),
    params:
        spec=lambda wc: config[wc.subset],
        paths=lambda wc: source_paths(config[wc.subset]["source"]),
        seed=config["seed"],
    script:
        "../../scripts/real_images.py"
