# E6: Precision, Recall, Density and Coverage, all vs avg.
localrules:
    E6,


rule E6:
    input:
        **experiment_scores("E6"),
    output:
        **experiment_outputs("E6"),
    log:
        f"{LOGS}/E6.log",
        cost=f"{BENCH}/E6.tsv",
    conda:
        "../../../envs/core.yaml"
    params:
        **experiment_params("E6"),
    script:
        "../../../scripts/experiment.py"
