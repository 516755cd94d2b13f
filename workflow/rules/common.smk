# Config lookups and input functions; nothing here computes results. Cross-key
# checks live in distrank.config, the experiments in distrank.experiments.
import os
import re

from snakemake.logging import logger
from snakemake.utils import validate

from distrank import experiments, zoo
from distrank.clients import n_clients
from distrank.config import check, check_file

for _file in workflow.configfiles:  # a key given twice: YAML would keep the last silently
    check_file(_file)
validate(config, "../schemas/config.schema.yaml")  # also fills the schema's defaults
for _warning in check(config):  # plugins: loaded here (and by every scoring job)
    logger.warning(_warning)

STUDY = config["study"]
RESULTS = f"results/{STUDY}"
FIGURES = f"figures/{STUDY}"
LOGS = f"logs/{STUDY}"
BENCH = f"benchmarks/{STUDY}"

# The experiments this config runs, and what they need from the rest of the DAG:
# the image models they add to the zoo, and per partition the models scored on it.
# The zoo's families: shipped checkpoints (sha256-pinned) and those trained in the DAG.
# A shipped checkpoint's path is relative to the repository (beside the Snakefile),
# whatever the working directory.
ZOO_PRETRAINED = {
    f: {**s, "pretrained": os.path.join(os.path.dirname(workflow.main_snakefile), s["pretrained"])}
    for f, s in config.get("zoo", {}).items()
    if s.get("pretrained")
}
ZOO_TRAINED = {
    f: {k: v for k, v in s.items() if k != "pretrained"}
    for f, s in config.get("zoo", {}).items()
    if f not in ZOO_PRETRAINED
}

EXPERIMENTS = {key: experiments.get(key) for key in config["experiments"]}
MODELS = dict(config["models"])
SCORED = {}
for _key, _exp in EXPERIMENTS.items():
    _settings = config["experiments"][_key]
    MODELS |= _exp.models(_settings, config)
    _scored = _exp.scores(_settings, config)
    if _scored:
        _models = SCORED.setdefault(_scored[0], [])
        _models += [m for m in _scored[1] if m not in _models]


wildcard_constraints:
    artifact=r"[A-Za-z0-9_-]+",  # no dots: <artifact>.d is its extraction folder
    model=r"[A-Za-z0-9_.+-]+",
    partition=r"[A-Za-z0-9_]+",
    client=r"c[0-9]+",


# Downloads land in resources/downloads/<artifact>, archives unpack beside it to
# <artifact>.d; both are shared by every study and verified against LOCKFILE where
# no checksum is published.
DOWNLOADS = config["downloads"]
LOCKFILE = "resources/checksums.lock"


def artifact_path(name):
    """What a config entry naming an artifact reads: the file, or its extraction folder."""
    path = f"resources/downloads/{name}"
    return f"{path}.d" if DOWNLOADS[name]["extract"] else path


def download_entry(wildcards):
    if wildcards.artifact not in DOWNLOADS:
        raise ValueError(
            f"resources/downloads/{wildcards.artifact}: {wildcards.artifact!r} is not one of "
            f"downloads: {sorted(DOWNLOADS)}"
        )
    return DOWNLOADS[wildcards.artifact]


def source_paths(source):
    """artifact -> local path, for load_source(paths=...); {} for a source given by `path`."""
    if "artifact" not in source:
        return {}
    return {source["artifact"]: artifact_path(source["artifact"])}


def clients(partition):
    """Client names of a partition; their number follows from the config alone."""
    return [f"c{i}" for i in range(n_clients(config["partitions"][partition]))]


def check_resources():
    """Warn about `resources` keys that name none of this workflow's rules (a typo,
    or a rule of an experiment that this config does not run)."""
    for name in sorted(set(config["resources"]) - {"default"} - {r.name for r in workflow.rules}):
        logger.warning(f"config: resources.{name} names no rule of this workflow")


def res(rule, key):
    """A rule's resource from config: its own entry, else the default."""
    return config["resources"].get(rule, config["resources"]["default"])[key]


def device(rule):
    """The torch device of a rule: CUDA where it is given GPUs (so a missing GPU fails
    loudly), else None, which picks CUDA when available."""
    return "cuda" if res(rule, "gpus") else None


def one_of(names):
    """A wildcard constraint matching exactly these names."""
    return "|".join(re.escape(n) for n in names) or "(?!)"


def model_files(spec):
    """What a model of `spec` is made from, by the name zoo.make_images reads it."""
    if spec["kind"] in zoo.FAMILIES:
        return {"state": f"{RESULTS}/zoo/{spec['kind']}.pt"}
    if spec["kind"] == "images":
        return {"source": path for path in source_paths(spec["source"]).values()}
    if spec["kind"] == "checkpoint":
        return {
            "checkpoint": artifact_path(spec["checkpoint"]),
            "code": artifact_path(spec["code"]),
        }
    return {"heldout": f"{RESULTS}/images/heldout.npz"}


def model_inputs(wildcards):
    return model_files(MODELS[wildcards.model])


def model_source_paths(wildcards):
    spec = MODELS[wildcards.model]
    return source_paths(spec["source"]) if spec["kind"] == "images" else {}


def model_features(models):
    return [f"{RESULTS}/features/model_{m}.npz" for m in models]


def scored_features(wildcards):
    """Every model scored on a partition: what each of its clients receives."""
    return model_features(SCORED[wildcards.partition])


def client_score_files(wildcards):
    """What the server reads for D_avg: the clients' small score files, nothing else."""
    return expand(
        f"{RESULTS}/scores/{wildcards.partition}/clients/{{client}}.json",
        client=clients(wildcards.partition),
    )


def experiment_scores(key):
    """The averaged and centralized score files of an experiment's partition."""
    partition, _ = EXPERIMENTS[key].scores(config["experiments"][key], config)
    return {
        "avg": f"{RESULTS}/scores/{partition}/avg.json",
        "all": f"{RESULTS}/scores/{partition}/all_centralized.json",
    }


def experiment_params(key):
    """What the experiment's run() gets: its settings and the study context."""
    scored = EXPERIMENTS[key].scores(config["experiments"][key], config)
    context = {
        "extractor": config["features"]["extractor"],
        "seed": config["seed"],
        "metrics": config["metrics"],
        "models": scored[1] if scored else [],
    }
    return {"settings": config["experiments"][key], "context": context}


def experiment_paths(key):
    """Tables (CSV, Markdown, LaTeX) and figures (PDF, PNG), named by the registry."""
    return EXPERIMENTS[key].paths(RESULTS, FIGURES)


def experiment_outputs(key):
    """The outputs of an experiment's rule: its paths, PNGs in the report with the
    caption workflow/report/<key>.rst (relative to the rule's file)."""
    outputs = experiment_paths(key)
    for name in outputs:
        if name.startswith("png"):
            outputs[name] = report(
                outputs[name], caption=f"../../report/{key}.rst", category="Experiments"
            )
    return outputs


# Final outputs of the studies beside E1-E10 (agreement.smk appends to it).
STUDY_TARGETS = []


def all_outputs():
    return [
        path
        for key in EXPERIMENTS
        for paths in experiment_paths(key).values()
        for path in ([paths] if isinstance(paths, str) else paths)
    ]
