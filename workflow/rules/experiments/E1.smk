# E1: KD consistency across the model zoo (Theorem 1), FD rank flips.
localrules:
    E1,


rule E1:
    input:
        **experiment_scores("E1"),
        images=[f"{RESULTS}/images/model_{m}.npz" for m in config["models"]],
        reference=f"{RESULTS}/images/reference.npz",
    output:
        **experiment_outputs("E1"),
    log:
        f"{LOGS}/E1.log",
        cost=f"{BENCH}/E1.tsv",
    conda:
        "../../../envs/core.yaml"
    params:
        **experiment_params("E1"),
    script:
        "../../../scripts/experiment.py"
