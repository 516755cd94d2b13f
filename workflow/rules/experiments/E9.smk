# E9: private client KD (Gaussian mechanism) against centralized KD, over epsilon.
localrules:
    E9,


E9_SETTINGS = config["experiments"]["E9"]
E9_MODELS = list(config["models"])


rule e9_kernel_inputs_centralized:
    input:
        reference=f"{RESULTS}/features/reference.npz",
        manifest=f"{RESULTS}/clients/{E9_SETTINGS['partition']}/manifest.csv",
        models=model_features(E9_MODELS),
    output:
        kernel_inputs=f"{RESULTS}/E9/kernel_inputs.npz",
    log:
        f"{LOGS}/e9_kernel_inputs_centralized.log",
        cost=f"{BENCH}/e9_kernel_inputs_centralized.tsv",
    conda:
        "../../../envs/core.yaml"
    threads: res("e9_kernel_inputs_centralized", "threads")
    resources:
        mem_mb=res("e9_kernel_inputs_centralized", "mem_mb"),
        runtime=res("e9_kernel_inputs_centralized", "runtime"),
    params:
        models=E9_MODELS,
        settings=E9_SETTINGS,
        metrics=config["metrics"],
        seed=config["seed"],
        device=device("e9_kernel_inputs_centralized"),
    script:
        "../../../scripts/experiment.py"


rule E9:
    input:
        kernel_inputs=f"{RESULTS}/E9/kernel_inputs.npz",
    output:
        **experiment_outputs("E9"),
    log:
        f"{LOGS}/E9.log",
        cost=f"{BENCH}/E9.tsv",
    conda:
        "../../../envs/core.yaml"
    params:
        **experiment_params("E9"),
    script:
        "../../../scripts/experiment.py"
