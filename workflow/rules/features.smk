# Image sets -> feature sets, with the extractor and preprocessing stored beside them.


rule extract_features:
    input:
        f"{RESULTS}/images/{{name}}.npz",
    output:
        f"{RESULTS}/features/{{name}}.npz",
    log:
        f"{LOGS}/extract_features/{{name}}.log",
        cost=f"{BENCH}/extract_features/{{name}}.tsv",
    wildcard_constraints:
        name=f"reference|heldout|model_({one_of(MODELS)})",  # image models only
    conda:
        "../../envs/torch.yaml"
    threads: res("extract_features", "threads")
    resources:
        mem_mb=res("extract_features", "mem_mb"),
        runtime=res("extract_features", "runtime"),
        gpu=res("extract_features", "gpus"),
    params:
        features=config["features"],
        device=device("extract_features"),
    script:
        "../../scripts/extract_features.py"
