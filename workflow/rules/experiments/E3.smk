# E3: Theorem 2 on Gaussians, in closed form (no data).
localrules:
    E3,


rule E3:
    output:
        **experiment_outputs("E3"),
    log:
        f"{LOGS}/E3.log",
        cost=f"{BENCH}/E3.tsv",
    conda:
        "../../../envs/core.yaml"
    params:
        **experiment_params("E3"),
    script:
        "../../../scripts/experiment.py"
