# Tables (CSV, Markdown, LaTeX) and figures (PDF, PNG) with the names fixed in paper.md.

localrules:
    average_clients,
    E1,
    E2,
    E3,
    E6,


rule E1:
    input:
        **experiment_scores("E1"),
    output:
        tables=multiext(f"{RESULTS}/E1_kd_consistency", ".csv", ".md", ".tex"),
        agreement=multiext(f"{RESULTS}/E1_kd_consistency_agreement", ".csv", ".md", ".tex"),
        pdf=f"{FIGURES}/E1_kd_consistency.pdf",
        png=report(f"{FIGURES}/E1_kd_consistency.png", caption="../report/E1.rst", category="Experiments"),
    params:
        extractor=config["features"]["extractor"],
    log:
        f"{LOGS}/E1.log",
    conda:
        "../../envs/core.yaml"
    script:
        "../../scripts/E1.py"


rule e2_models_centralized:
    input:
        clients=lambda wc: expand(
            f"{RESULTS}/clients/{config['experiments']['E2']['partition']}/{{client}}.npz",
            client=clients(config["experiments"]["E2"]["partition"]),
        ),
        base=f"{RESULTS}/features/model_{config['experiments']['E2']['base_model']}.npz",
    output:
        g1=f"{RESULTS}/features/model_e2-G1.npz",
        g2=f"{RESULTS}/features/model_e2-G2.npz",
    params:
        classes=config["partitions"][config["experiments"]["E2"]["partition"]].get("classes"),
        seed=config["seed"],
    log:
        f"{LOGS}/e2_models_centralized.log",
    conda:
        "../../envs/core.yaml"
    script:
        "../../scripts/e2_models_centralized.py"


rule E2:
    input:
        **experiment_scores("E2"),
    output:
        tables=multiext(f"{RESULTS}/E2_fd_counterexample", ".csv", ".md", ".tex"),
        pdf=f"{FIGURES}/E2_fd_counterexample.pdf",
        png=report(f"{FIGURES}/E2_fd_counterexample.png", caption="../report/E2.rst", category="Experiments"),
    params:
        extractor=config["features"]["extractor"],
    log:
        f"{LOGS}/E2.log",
    conda:
        "../../envs/core.yaml"
    script:
        "../../scripts/E2.py"


rule E3:
    output:
        tables=multiext(f"{RESULTS}/E3_gaussian_theory", ".csv", ".md", ".tex"),
        curves=multiext(f"{RESULTS}/E3_gaussian_theory_curves", ".csv", ".md", ".tex"),
        pdf=f"{FIGURES}/E3_gaussian_theory.pdf",
        png=report(f"{FIGURES}/E3_gaussian_theory.png", caption="../report/E3.rst", category="Experiments"),
    params:
        settings=config["experiments"]["E3"],
    log:
        f"{LOGS}/E3.log",
    conda:
        "../../envs/core.yaml"
    script:
        "../../scripts/E3.py"


rule E6:
    input:
        **experiment_scores("E6"),
    output:
        tables=multiext(f"{RESULTS}/E6_prdc", ".csv", ".md", ".tex"),
        agreement=multiext(f"{RESULTS}/E6_prdc_agreement", ".csv", ".md", ".tex"),
        pdf=f"{FIGURES}/E6_prdc.pdf",
        png=report(f"{FIGURES}/E6_prdc.png", caption="../report/E6.rst", category="Experiments"),
    params:
        extractor=config["features"]["extractor"],
    log:
        f"{LOGS}/E6.log",
    conda:
        "../../envs/core.yaml"
    script:
        "../../scripts/E6.py"
