"""The rehearsal against the real upstream code (bench/rehearse.py, issue 37).

Runs only where ``$DISTRANK_UPSTREAM`` names a folder holding the public trees at the
pinned commits (``stylegan2-ada-pytorch-<commit>/``, ``edm-<commit>/``, as GitHub's
archives unpack); skipped otherwise, since this repository holds no upstream code.
``DISTRANK_REHEARSE_DAG=1`` also runs every full-scale config's DAG at toy size
(minutes to an hour on 2 cores); without it, each toy DAG is only planned
(``snakemake -n``).
"""

import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from distrank.zoo.checkpoints import generate_from_checkpoint
from distrank.zoo.upstream import EDM, STYLEGAN2_ADA, upstream_code

REPO = Path(__file__).resolve().parents[2]
UPSTREAM = os.environ.get("DISTRANK_UPSTREAM")
#: ``git rev-parse <commit>^{tree}`` of the pinned commits (from the public repositories).
TREES = {
    STYLEGAN2_ADA.commit: "16d29ac2382905a790bf5a692eab85f5eb513e26",
    EDM.commit: "27d2022e3ecbe6348f99d9a8c468fa0971bd649f",
}

pytestmark = pytest.mark.skipif(
    not UPSTREAM
    or not all((Path(UPSTREAM) / u.top_folder / "dnnlib").is_dir() for u in (STYLEGAN2_ADA, EDM)),
    reason="needs $DISTRANK_UPSTREAM with the pinned upstream source trees",
)


@pytest.fixture(scope="module")
def rehearse():
    spec = importlib.util.spec_from_file_location("rehearse", REPO / "bench" / "rehearse.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def trees(rehearse):
    return rehearse.trees(Path(UPSTREAM))


def test_code_archives_are_identified_by_commit_and_git_tree(rehearse, trees, tmp_path):
    from distrank.data.checksums import archive_identity

    for key, pinned in (("stylegan2_ada", STYLEGAN2_ADA), ("edm", EDM)):
        path = tmp_path / f"{key}.tar.gz"
        path.write_bytes(rehearse.code_archive(trees[key], pinned.commit))
        identity = archive_identity(path)
        assert identity.commit == pinned.commit and identity.tree == TREES[pinned.commit]


def test_stylegan2_images_are_generate_py_images_at_every_batch_size(rehearse, trees, tmp_path):
    tree = trees["stylegan2_ada"]
    pkl = rehearse.stylegan_pickle(tree, tmp_path / "sg.pkl", resolution=32, c_dim=10)
    seeds = list(range(5, 11))
    theirs = rehearse.upstream_stylegan(
        tree, pkl, seeds, psi=0.7, class_idx=3, device="cpu", outdir=tmp_path / "out"
    )
    for batch in (1, 4):
        ours, labels = generate_from_checkpoint(
            pkl, tree, n=6, seed=5, truncation_psi=0.7, class_idx=3, batch_size=batch,
            device="cpu", trust_pickles=True,
        )  # fmt: skip
        np.testing.assert_array_equal(ours, theirs)
        assert labels.tolist() == [3] * 6
    assert not [name for name in sys.modules if name.startswith("_imported_module_")]  # item 5
    assert "training" not in sys.modules and "torch_utils" not in sys.modules


def test_edm_images_are_upstream_sampler_images(rehearse, trees, tmp_path):
    tree = trees["edm"]
    pkl = rehearse.edm_pickle(tree, tmp_path / "edm.pkl", resolution=16, label_dim=10)
    seeds = list(range(3, 8))
    theirs = rehearse.upstream_edm(tree, pkl, seeds, class_idx=None, num_steps=4, device="cpu")
    for batch in (1, 5):
        ours, _ = generate_from_checkpoint(
            pkl, tree, n=5, seed=3, num_steps=4, batch_size=batch, device="cpu",
            trust_pickles=True,
        )  # fmt: skip
        np.testing.assert_array_equal(ours, theirs)


def test_real_custom_ops_load_the_plugin_that_load_returns(trees, monkeypatch):
    """Item 1 with upstream's own get_plugin; the build is stubbed (no nvcc on CPU)."""
    import torch.utils.cpp_extension

    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.setattr(
        torch.utils.cpp_extension, "load", lambda name, **kwargs: type(sys)(name)
    )  # torch 2.x: returns the module, registers nothing in sys.modules
    tree = trees["stylegan2_ada"]
    saved = list(sys.path)
    sys.path.insert(0, str(tree))
    try:  # upstream unpatched: the import by name fails after a "successful" build
        from torch_utils import custom_ops

        with pytest.raises(ModuleNotFoundError, match="rehearsal_plugin"):
            custom_ops.get_plugin("rehearsal_plugin", sources=[str(tree / "x.cu")])
    finally:
        sys.path[:] = saved
        for name in [n for n in sys.modules if n.partition(".")[0] == "torch_utils"]:
            del sys.modules[name]
    with upstream_code(tree):
        from torch_utils import custom_ops

        plugin = custom_ops.get_plugin("rehearsal_plugin", sources=[str(tree / "x.cu")])
        assert plugin.__name__ == "rehearsal_plugin"
    assert "rehearsal_plugin" not in sys.modules


@pytest.mark.parametrize("name", ["cifar10", "ffhq", "afhq", "imagenet256"])
def test_toy_dag_of_each_full_scale_config(rehearse, trees, tmp_path, name):
    dry_run = os.environ.get("DISTRANK_REHEARSE_DAG") != "1"
    result = rehearse.run_dag(name, trees, tmp_path, cores=2, until=None, dry_run=dry_run)
    assert result["returncode"] == 0, Path(result["log"]).read_text()[-3000:]
    if not dry_run:
        assert result["figures"]
        assert {e["tree"] for e in result["code_archives"].values()} <= set(TREES.values())
