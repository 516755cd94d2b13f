# Config lookups and input functions; nothing here computes results.
from snakemake.logging import logger
from snakemake.utils import validate


validate(config, "../schemas/config.schema.yaml")  # also fills the schema's defaults
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
    artifact=r"[A-Za-z0-9_-]+",  # no dots: <artifact>.d is its extraction folder
    model=r"[A-Za-z0-9_.+-]+",
    partition=r"[A-Za-z0-9_]+",
    client=r"c[0-9]+",


MODELS = config["models"]
TRAINED = ("cgan", "vae")  # kinds sampled from a generator trained in the DAG
FROM_HELDOUT = ("heldout", "noise", "blur", "mode_drop")  # kinds made from held-out images
for _name, _spec in MODELS.items():
    if _spec["kind"] in TRAINED and _spec["kind"] not in config.get("zoo", {}):
        raise ValueError(f"config: models.{_name} is a {_spec['kind']}, but zoo.{_spec['kind']} is not set")
    if _spec["kind"] in FROM_HELDOUT and "heldout" not in config:
        raise ValueError(
            f"config: models.{_name} is a {_spec['kind']} model, made from held-out real "
            "images, but the config has no heldout"
        )
if config["experiments"]["E2"]["base_model"] not in MODELS:
    raise ValueError(
        f"config: experiments.E2.base_model {config['experiments']['E2']['base_model']!r} "
        f"is not one of models: {sorted(MODELS)}"
    )

# E2's two models live in feature space (Proposition 1's construction).
E2_MODELS = ["e2-G1", "e2-G2"]

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


def _check_artifact(where, name, *, extract):
    if name not in DOWNLOADS:
        raise ValueError(f"config: {where} is {name!r}, not one of downloads: {sorted(DOWNLOADS)}")
    if DOWNLOADS[name]["extract"] != extract:
        raise ValueError(
            f"config: {where} {name!r} is read {'unpacked' if extract else 'as a file'}, "
            f"so downloads.{name}.extract must be {str(extract).lower()}"
        )


def _labelled(source):
    """False where the source surely has no labels: a folder not labelled by subfolder."""
    return source["kind"] != "folder" or source.get("labels_from_subfolders", False)


SOURCES = {s: config[s]["source"] for s in ("reference", "heldout") if s in config}
for _name, _spec in MODELS.items():
    if _spec["kind"] == "images":
        SOURCES[f"models.{_name}"] = _spec["source"]
        if "max_images" in _spec["source"]:
            raise ValueError(
                f"config: models.{_name}.source.max_images: an images model takes the first "
                "n_samples images of its source; set n_samples instead"
            )
    if _spec["kind"] == "checkpoint":
        _check_artifact(f"models.{_name}.checkpoint", _spec["checkpoint"], extract=False)
        _check_artifact(f"models.{_name}.code", _spec["code"], extract=True)
for _where, _source in SOURCES.items():
    if "artifact" in _source:  # a folder reads an unpacked archive, npz and cifar10 the file
        _check_artifact(
            f"{_where}.source.artifact", _source["artifact"], extract=_source["kind"] == "folder"
        )
if not _labelled(config["reference"]["source"]):
    _unlabelled_needs = ["reference.per_class"] if "per_class" in config["reference"] else []
    _used = {e["partition"] for e in config["experiments"].values() if "partition" in e}
    _unlabelled_needs += [
        f"partitions.{p} ({config['partitions'][p]['kind']})"
        for p in sorted(_used)
        if config["partitions"][p]["kind"] != "kmeans"  # the only scheme without labels
    ]
    if _unlabelled_needs:
        raise ValueError(
            f"config: {', '.join(_unlabelled_needs)} need(s) class labels, but reference.source "
            "is a folder without labels_from_subfolders; use n and kmeans partitions"
        )

CHECKPOINT_MODELS = [m for m, spec in MODELS.items() if spec["kind"] == "checkpoint"]
if CHECKPOINT_MODELS and not config["trust_pickles"]:
    logger.warning(
        f"config: trust_pickles is false, so generating {', '.join(CHECKPOINT_MODELS)} will "
        "fail: loading a network pickle runs code from it. Set trust_pickles: true only for "
        "checkpoints you trust (e.g. NVIDIA's, verified by checksum)."
    )


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


def device(rule):
    """The torch device of a rule: CUDA where it is given GPUs (so a missing GPU fails
    loudly), else None, which picks CUDA when available."""
    return "cuda" if res(rule, "gpus") else None


def model_inputs(wildcards):
    spec = MODELS[wildcards.model]
    if spec["kind"] in TRAINED:
        return {"state": f"{RESULTS}/zoo/{spec['kind']}.pt"}
    if spec["kind"] == "images":
        return {"source": path for path in source_paths(spec["source"]).values()}
    if spec["kind"] == "checkpoint":
        return {
            "checkpoint": artifact_path(spec["checkpoint"]),
            "code": artifact_path(spec["code"]),
        }
    return {"heldout": f"{RESULTS}/images/heldout.npz"}


def model_source_paths(wildcards):
    spec = MODELS[wildcards.model]
    return source_paths(spec["source"]) if spec["kind"] == "images" else {}


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
