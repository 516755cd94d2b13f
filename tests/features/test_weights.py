"""Weights lookup: directory first (argument, env var, default), then verified download; safe loading."""

from __future__ import annotations

import argparse
import json
import pickle
import time

import pytest

torch = pytest.importorskip("torch")

from distrank.features.weights import (  # noqa: E402
    WEIGHTS,
    WeightsFile,
    WeightsNotFoundError,
    file_sha256,
    load_state_dict,
    resolve_weights,
    weights_dir,
)


@pytest.fixture
def source(tmp_path):
    """A small weights file and a spec naming it by URL (file://) and sha256 prefix."""
    src = tmp_path / "upstream" / "tiny-weights.pth"
    src.parent.mkdir()
    torch.save({"w": torch.arange(6.0).reshape(2, 3)}, src)
    spec = WeightsFile(
        filename="tiny-weights.pth",
        url=src.as_uri(),
        description="a tiny test network",
        sha256_prefix=file_sha256(src)[:8],
        aliases=("tiny-alias.pth",),
    )
    return src, spec


def test_weights_dir_precedence(monkeypatch, tmp_path):
    for name in ("DISTRANK_WEIGHTS_DIR", "DISTRANK_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert weights_dir() == tmp_path / "xdg" / "distrank" / "weights"  # test_user_cache: more
    monkeypatch.setenv("DISTRANK_WEIGHTS_DIR", str(tmp_path / "env"))
    assert weights_dir() == tmp_path / "env"
    assert weights_dir(tmp_path / "arg") == tmp_path / "arg"


def test_found_in_directory_and_by_alias(source, tmp_path, monkeypatch):
    src, spec = source
    local = tmp_path / "w"
    local.mkdir()
    (local / "tiny-alias.pth").write_bytes(src.read_bytes())
    assert resolve_weights(spec, local, offline=True) == local / "tiny-alias.pth"
    monkeypatch.setenv("DISTRANK_WEIGHTS_DIR", str(local))
    assert resolve_weights(spec, offline=True) == local / "tiny-alias.pth"


def test_offline_missing_fails_at_once_naming_file_and_place(source, tmp_path, monkeypatch):
    _, spec = source
    monkeypatch.setenv("DISTRANK_OFFLINE", "1")
    start = time.monotonic()
    with pytest.raises(WeightsNotFoundError) as info:
        resolve_weights(spec, tmp_path / "empty")
    assert time.monotonic() - start < 1
    assert str(info.value) == (
        f"offline and tiny-weights.pth is missing: put tiny-weights.pth (a tiny test network, "
        f"from {spec.url}) into {(tmp_path / 'empty').resolve()}/ (or point "
        "$DISTRANK_WEIGHTS_DIR or the config's weights directory at a folder holding it)"
    )


def test_download_records_checksum_in_lockfile(source, tmp_path):
    src, spec = source
    lock = tmp_path / "checksums.lock"
    path = resolve_weights(spec, tmp_path / "w", offline=False, lockfile=lock)
    assert path == tmp_path / "w" / "tiny-weights.pth" and path.read_bytes() == src.read_bytes()
    entry = json.loads(lock.read_text())[spec.url]
    assert entry["sha256"] == file_sha256(src)
    assert load_state_dict(path)["w"].shape == (2, 3)


def test_failed_download_names_file_and_place(tmp_path, monkeypatch):
    from distrank.data import download
    from distrank.data.transfer import DownloadError

    def unreachable(url, dest, **kwargs):
        raise DownloadError(f"{url}: network is unreachable")

    monkeypatch.setattr(download, "fetch", unreachable)
    spec = WeightsFile(
        filename="gone.pth",
        url="https://example.invalid/gone.pth",
        description="a missing file",
        sha256="0" * 64,
    )
    with pytest.raises(
        WeightsNotFoundError, match=r"^could not download https://example\.invalid/gone\.pth "
    ) as info:
        resolve_weights(spec, tmp_path / "w", offline=False)
    assert str(info.value).startswith(
        f"could not download {spec.url} ({spec.url}: network is unreachable); put gone.pth "
        f"(a missing file, from {spec.url}) into {(tmp_path / 'w').resolve()}/ "
    )


def test_wrong_file_is_rejected(source, tmp_path):
    _, spec = source
    local = tmp_path / "w"
    local.mkdir()
    torch.save({"w": torch.zeros(1)}, local / "tiny-weights.pth")
    with pytest.raises(ValueError, match="expected a digest starting with"):
        resolve_weights(spec, local, offline=True)


def test_load_state_dict_is_weights_only(tmp_path):
    path = tmp_path / "obj.pth"
    torch.save({"x": argparse.Namespace(code="would run on a full unpickle")}, path)
    with pytest.raises(pickle.UnpicklingError, match=r"^Weights only load failed"):
        load_state_dict(path)
    torch.save({"state_dict": {"a": torch.ones(2)}}, path)
    assert set(load_state_dict(path)) == {"a"}
    torch.save([torch.ones(2)], path)
    with pytest.raises(ValueError, match="state dict"):
        load_state_dict(path)


def test_published_specs():
    inception = WEIGHTS["inception"]
    assert (
        inception.filename.endswith(f"-{inception.sha256[:8]}.pth") and len(inception.sha256) == 64
    )
    assert WEIGHTS["dinov2_vitl14"].url.endswith("dinov2_vitl14_pretrain.pth")
