# E8: client heterogeneity (Dirichlet label skew to one class per client) against the
# rank agreement of avg and all, over the whole zoo. A simulation over partitions: one
# centralized job scores every partition in both aggregations with the same engine.
rule E8:
    input:
        reference=f"{RESULTS}/features/reference.npz",
        models=model_features(config["models"]),
    output:
        **experiment_outputs("E8"),
    log:
        f"{LOGS}/E8.log",
        cost=f"{BENCH}/E8.tsv",
    conda:
        "../../../envs/core.yaml"
    threads: res("E8", "threads")
    resources:
        mem_mb=res("E8", "mem_mb"),
        runtime=res("E8", "runtime"),
        gpu=res("E8", "gpus"),
    params:
        **experiment_params("E8"),
    script:
        "../../../scripts/experiment.py"
