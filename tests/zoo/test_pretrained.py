"""Shipped generators (distrank.zoo.pretrained, pretrained/, configs/zoo-pretrain.yaml)."""

import hashlib
import io
import json
from importlib import metadata
from pathlib import Path

import pytest
import torch
import yaml

from distrank import zoo
from distrank._checks import InputError
from distrank.zoo.pretrained import install, provenance, verify

ROOT = Path(__file__).resolve().parents[2]
PRETRAIN = yaml.safe_load((ROOT / "configs/zoo-pretrain.yaml").read_text())
DEFAULT = yaml.safe_load((ROOT / "config.yaml").read_text())


def sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture
def checkpoint(tmp_path, toy):
    path = tmp_path / "cgan.pt"
    zoo.save_state(path, zoo.train("cgan", *toy, seed=0, steps=2, width=8, z_dim=8, threads=1))
    return path


def test_install_copies_a_checkpoint_whose_sha256_matches(checkpoint, tmp_path):
    out = tmp_path / "results" / "cgan.pt"
    install(checkpoint, sha256(checkpoint), out)
    assert out.read_bytes() == checkpoint.read_bytes()


def test_a_modified_checkpoint_is_refused_naming_the_file(checkpoint, tmp_path):
    pinned = sha256(checkpoint)
    data = bytearray(checkpoint.read_bytes())
    data[len(data) // 2] ^= 1
    checkpoint.write_bytes(bytes(data))
    out = tmp_path / "results" / "cgan.pt"
    with pytest.raises(InputError) as raised:
        install(checkpoint, pinned, out)
    assert raised.value.path == checkpoint
    assert str(raised.value).startswith(f"{checkpoint}: sha256 is {sha256(checkpoint)}, ")
    assert f"but the config pins {pinned}" in str(raised.value)
    assert not out.exists() and not out.parent.exists() or not any(out.parent.iterdir())


def test_a_missing_checkpoint_is_named(tmp_path):
    with pytest.raises(InputError, match=r"^.*absent\.pt: no such checkpoint file$"):
        verify(tmp_path / "absent.pt", "0" * 64)


def test_provenance_records_the_file_and_its_training(checkpoint):
    state = zoo.load_state(checkpoint)
    settings = {"steps": 2, "width": 8, "z_dim": 8}
    record = provenance(
        checkpoint, state, settings=settings, seed=0, threads=1, images={"n": 160}, wall_s=1.23
    )
    assert record["sha256"] == sha256(checkpoint)
    assert record["config"] == {"steps": 2, "width": 8, "z_dim": 8, "seed": 0, "threads": 1}
    assert record["steps"] == 2 and record["wall_s"] == 1.2
    assert record["versions"]["torch"] == metadata.version("torch")
    assert record["history"] == state["history"]
    json.dumps(record)  # plain JSON


@pytest.mark.parametrize("family", sorted(PRETRAIN["zoo"]))
def test_retraining_from_the_pretrain_config_is_deterministic(family, toy):
    """The pretrain config's settings, for 3 steps on one thread: the same bytes twice."""
    settings = {**PRETRAIN["zoo"][family], "steps": 3}
    threads = PRETRAIN["resources"]["train_generator"]["threads"]

    def saved():
        buffer = io.BytesIO()
        torch.save(
            zoo.train(family, *toy, seed=PRETRAIN["seed"], threads=threads, **settings), buffer
        )
        return buffer.getvalue()

    assert saved() == saved()


@pytest.mark.parametrize("family", zoo.FAMILIES)
def test_the_default_study_pins_its_shipped_checkpoints(family):
    """config.yaml's sha256 pins are the files in pretrained/ and their provenance."""
    entry = DEFAULT["zoo"][family]
    path = ROOT / entry["pretrained"]
    record = json.loads(path.with_suffix(".json").read_text())
    assert sha256(path) == entry["sha256"] == record["sha256"]
    assert record["family"] == family and record["file"] == path.name
    assert record["config"] == {**PRETRAIN["zoo"][family], "seed": 0, "threads": 1}
    assert record["images"]["source"] == {"kind": "fashion_mnist", "split": "train", "root": None}
    assert record["images"]["count"] == 60_000
    assert record["history"]["step"][-1] == record["steps"] == PRETRAIN["zoo"][family]["steps"]
