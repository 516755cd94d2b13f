# E2: Proposition 1, two models with the same FD at every client, different FD_all.
from distrank.experiments.e2_fd_counterexample import G1, G2


localrules:
    E2,


E2_PARTITION = config["experiments"]["E2"]["partition"]


rule e2_models_centralized:
    input:
        clients=expand(
            f"{RESULTS}/clients/{E2_PARTITION}/{{client}}.npz",
            client=clients(E2_PARTITION),
        ),
        base=f"{RESULTS}/features/model_{config['experiments']['E2']['base_model']}.npz",
    output:
        g1=f"{RESULTS}/features/model_{G1}.npz",
        g2=f"{RESULTS}/features/model_{G2}.npz",
    log:
        f"{LOGS}/e2_models_centralized.log",
        cost=f"{BENCH}/e2_models_centralized.tsv",
    conda:
        "../../../envs/core.yaml"
    params:
        classes=config["partitions"][E2_PARTITION].get("classes"),
        seed=config["seed"],
    script:
        "../../../scripts/experiment.py"


rule E2:
    input:
        **experiment_scores("E2"),
    output:
        **experiment_outputs("E2"),
    log:
        f"{LOGS}/E2.log",
        cost=f"{BENCH}/E2.tsv",
    conda:
        "../../../envs/core.yaml"
    params:
        **experiment_params("E2"),
    script:
        "../../../scripts/experiment.py"
