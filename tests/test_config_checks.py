"""distrank.config.check: every cross-key check, on config dicts, without Snakemake."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from distrank.config import check

REPO = Path(__file__).resolve().parents[1]
DEFAULT = yaml.safe_load((REPO / "config.yaml").read_text())
DOWNLOAD = {"url": "https://example.org/x", "sha256": None, "md5": None, "size": None}


def config(**changes) -> dict:
    cfg = copy.deepcopy(DEFAULT)
    cfg.update(changes)
    return cfg


def raises(cfg: dict, *fragments: str) -> None:
    with pytest.raises(ValueError) as err:
        check(cfg)
    for fragment in fragments:
        assert fragment in str(err.value)


def test_the_default_config_passes_without_warnings():
    assert check(config()) == []


def test_every_shipped_config_passes():
    for path in sorted((REPO / "configs").glob("*.yaml")) + [REPO / "tests/e2e/tiny.yaml"]:
        check(yaml.safe_load(path.read_text()))


def test_a_study_scores_the_metrics_its_experiments_read():
    cfg = config(metrics={**DEFAULT["metrics"], "metrics": ["fd"]})
    raises(cfg, "metrics.metrics is ['fd'], but experiments.E1 reads ['kd', 'precision'")
    cfg["experiments"] = {"E3": DEFAULT["experiments"]["E3"], "E4": DEFAULT["experiments"]["E4"]}
    assert check(cfg) == []  # E4 reads FD only, E3 no scores


def test_a_family_model_needs_its_zoo_entry():
    cfg = config()
    del cfg["zoo"]["vae"]
    raises(cfg, "models.vae-t0.8 is a vae", "zoo.vae is not set")


def test_a_heldout_model_needs_heldout_images():
    cfg = config()
    del cfg["heldout"]
    raises(cfg, "models.real is a heldout model", "no heldout")


def test_an_images_model_takes_n_samples_not_max_images():
    cfg = config()
    cfg["models"]["mine"] = {
        "kind": "images",
        "source": {"kind": "npz", "path": "x.npz", "max_images": 5},
    }
    raises(cfg, "models.mine.source.max_images", "set n_samples")


def test_a_checkpoint_names_a_download():
    cfg = config()
    cfg["models"]["sg"] = {"kind": "checkpoint", "checkpoint": "sg_pkl", "code": "sg_code"}
    raises(cfg, "models.sg.checkpoint is 'sg_pkl', not one of downloads")


def test_a_checkpoints_code_is_unpacked():
    cfg = config(
        downloads={
            "sg_pkl": {**DOWNLOAD, "extract": False},
            "sg_code": {**DOWNLOAD, "extract": False},
        }
    )
    cfg["models"]["sg"] = {"kind": "checkpoint", "checkpoint": "sg_pkl", "code": "sg_code"}
    raises(
        cfg, "models.sg.code 'sg_code' is read unpacked", "downloads.sg_code.extract must be true"
    )


def test_a_folder_source_reads_an_unpacked_archive():
    cfg = config(downloads={"imgs": {**DOWNLOAD, "extract": False}})
    cfg["reference"]["source"] = {
        "kind": "folder",
        "artifact": "imgs",
        "labels_from_subfolders": True,
    }
    raises(cfg, "reference.source.artifact 'imgs' is read unpacked")


def test_an_npz_source_reads_the_file():
    cfg = config(downloads={"batch": {**DOWNLOAD, "extract": True}})
    cfg["heldout"]["source"] = {"kind": "npz", "artifact": "batch"}
    raises(
        cfg,
        "heldout.source.artifact 'batch' is read as a file",
        "downloads.batch.extract must be false",
    )


def test_an_experiments_partition_exists():
    cfg = config()
    cfg["experiments"]["E1"]["partition"] = "dirichlett"
    raises(cfg, "experiments.E1.partition is 'dirichlett'", "not one of partitions")


def test_an_unknown_experiment_is_named():
    cfg = config()
    cfg["experiments"]["E99"] = {}
    raises(cfg, "experiments.E99 is not an experiment")


def test_e2_base_model_is_a_model():
    cfg = config()
    cfg["experiments"]["E2"]["base_model"] = "realz"
    raises(cfg, "experiments.E2.base_model 'realz' is not one of models")


def test_unlabelled_reference_cannot_be_split_by_class():
    cfg = config(experiments={k: DEFAULT["experiments"][k] for k in ("E1", "E2", "E6")})
    cfg["reference"] = {"source": {"kind": "folder", "path": "imgs/"}, "n": 100}
    raises(
        cfg,
        "partitions.by_class (by_class)",
        "partitions.one_class (one_class)",
        "need(s) class labels",
    )


def test_unlabelled_reference_cannot_be_drawn_per_class():
    cfg = config(experiments={"E3": DEFAULT["experiments"]["E3"]})
    cfg["reference"]["source"] = {"kind": "folder", "path": "imgs/"}
    raises(cfg, "reference.per_class need(s) class labels")


def test_unlabelled_reference_with_kmeans_passes():
    cfg = config(experiments={"E1": {"partition": "kmeans"}})
    cfg["reference"] = {"source": {"kind": "folder", "path": "imgs/"}, "n": 100}
    assert check(cfg) == []


def test_untrusted_checkpoints_warn():
    cfg = config(
        downloads={
            "sg_pkl": {**DOWNLOAD, "extract": False},
            "sg_code": {**DOWNLOAD, "extract": True},
        }
    )
    cfg["models"]["sg"] = {"kind": "checkpoint", "checkpoint": "sg_pkl", "code": "sg_code"}
    (warning,) = check(cfg)
    assert warning.startswith("config: trust_pickles is false, so generating sg will fail: ")
    assert check({**cfg, "trust_pickles": True}) == []


def test_a_knob_a_model_does_not_have_is_named_before_any_job():
    import copy

    import yaml

    from distrank.config import check

    config = yaml.safe_load((REPO / "config.yaml").read_text())
    typo = copy.deepcopy(config)
    typo["models"]["cgan-t1"] = {"kind": "cgan", "truncaton": 1.0}
    with pytest.raises(
        ValueError, match=r"^config: models.cgan-t1.truncaton: a cgan model has no knob 'truncaton'"
    ):
        check(typo)
    sweep = copy.deepcopy(config)
    sweep["experiments"]["E4"]["families"]["vae"]["knob"] = "temprature"
    with pytest.raises(
        ValueError,
        match=r"E4.families.vae.knob: a vae model has no knob 'temprature'; its knobs: \['temperature'\]",
    ):
        check(sweep)


def _imagenet() -> dict:
    return yaml.safe_load((REPO / "configs" / "imagenet256.yaml").read_text())


def test_a_label_free_source_cannot_feed_class_partitions_before_any_download():
    cfg = _imagenet()
    cfg["reference"]["source"]["labels"] = False
    raises(
        cfg,
        "partitions.dirichlet (dirichlet), partitions.one_class (one_class), experiments.E8",
        "declared label-free (labels: false)",
        "kmeans",
    )


def test_the_label_free_route_of_imagenet_passes():
    cfg = _imagenet()
    cfg["reference"]["source"]["labels"] = False
    del cfg["experiments"]["E8"]
    for key in ("E1", "E2", "E6"):
        cfg["experiments"][key]["partition"] = "kmeans"
    assert check(cfg) == []


def test_declared_labels_name_exactly_what_needs_them():
    cfg = _imagenet()
    assert check(cfg) == []
    cfg["reference"]["source"]["labels"] = ["partitions.dirichlet"]
    raises(
        cfg,
        "reference.source.labels lists ['partitions.dirichlet']",
        "write labels: ['partitions.dirichlet', 'partitions.one_class', 'experiments.E8']",
    )
    del cfg["reference"]["source"]["labels"]
    (warning,) = check(cfg)
    assert "npz, which has them only if it holds arr_1" in warning


def test_a_folder_without_labels_cannot_be_declared_labelled():
    cfg = config(experiments={"E1": {"partition": "kmeans"}})
    cfg["reference"] = {"source": {"kind": "folder", "path": "imgs/", "labels": True}, "n": 100}
    raises(cfg, "reference.source.labels is True", "folder without labels_from_subfolders")
