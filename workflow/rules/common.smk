# Config lookups and input functions; nothing here computes results.
from snakemake.utils import validate


validate(config, "../schemas/config.schema.yaml")
for _exp, _spec in config["experiments"].items():
    if "partition" in _spec and _spec["partition"] not in config["partitions"]:
        raise ValueError(
            f"config: experiments.{_exp}.partition is {_spec['partition']!r}, "
            f"not one of partitions: {sorted(config['partitions'])}"
        )

STUDY = config["study"]
RESULTS = f"results/{STUDY}"
FIGURES = f"figures/{STUDY}"
LOGS = f"logs/{STUDY}"
BENCH = f"benchmarks/{STUDY}"
TABLE_EXT = ["csv", "md", "tex"]
FIGURE_EXT = ["pdf", "png"]


wildcard_constraints:
    model=r"[A-Za-z0-9_.+-]+",
    partition=r"[A-Za-z0-9_]+",
    client=r"c[0-9]+",


MODELS = config["models"]
TRAINED = ("cgan", "vae")  # kinds sampled from a generator trained in the DAG
for _name, _spec in MODELS.items():
    if _spec["kind"] in TRAINED and _spec["kind"] not in config.get("zoo", {}):
        raise ValueError(f"config: models.{_name} is a {_spec['kind']}, but zoo.{_spec['kind']} is not set")
if config["experiments"]["E2"]["base_model"] not in MODELS:
    raise ValueError(
        f"config: experiments.E2.base_model {config['experiments']['E2']['base_model']!r} "
        f"is not one of models: {sorted(MODELS)}"
    )
# E2's two models live in feature space (Proposition 1's construction).
E2_MODELS = ["e2-G1", "e2-G2"]


def clients(partition):
    """Client names of a partition; their number follows from the config alone."""
    scheme = config["partitions"][partition]
    n = {
        "by_class": lambda: len(scheme.get("groups", [])),
        "one_class": lambda: len(scheme.get("classes", [])),
    }.get(scheme["kind"], lambda: scheme["n_clients"])()
    return [f"c{i}" for i in range(n)]


def res(rule, key):
    """A rule's resource from config: its own entry, else the default."""
    return config["resources"].get(rule, config["resources"]["default"])[key]


def model_inputs(wildcards):
    spec = MODELS[wildcards.model]
    if spec["kind"] in TRAINED:
        return {"state": f"{RESULTS}/zoo/{spec['kind']}.pt"}
    return {"heldout": f"{RESULTS}/images/heldout.npz"}


def experiment_models(exp):
    return E2_MODELS if exp == "E2" else list(MODELS)


def client_score_files(wildcards):
    """What the server reads for D_avg: the clients' small score files, nothing else."""
    return expand(
        f"{RESULTS}/scores/{wildcards.partition}/{wildcards.model}/{{client}}.json",
        client=clients(wildcards.partition),
    )


def experiment_scores(exp):
    """The centralized and averaged score files of an experiment's models."""
    part = config["experiments"][exp]["partition"]
    models = experiment_models(exp)
    return {
        "avg": expand(f"{RESULTS}/scores/{part}/{{model}}/avg.json", model=models),
        "all": expand(
            f"{RESULTS}/scores/{part}/{{model}}/all_centralized.json", model=models
        ),
    }


EXPERIMENT_NAMES = {
    "E1": "kd_consistency",
    "E2": "fd_counterexample",
    "E3": "gaussian_theory",
    "E6": "prdc",
}


def experiment_outputs(exp):
    stem = f"{exp}_{EXPERIMENT_NAMES[exp]}"
    return expand(f"{RESULTS}/{stem}.{{ext}}", ext=TABLE_EXT) + expand(
        f"{FIGURES}/{stem}.{{ext}}", ext=FIGURE_EXT
    )


def all_outputs():
    return [f for exp in config["experiments"] for f in experiment_outputs(exp)]
