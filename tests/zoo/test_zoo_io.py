"""Zoo persistence, dispatch and the torch session (distrank.zoo)."""

import numpy as np
import pytest
import torch

from distrank import zoo


def test_samples_round_trip_as_nhwc(tmp_path):
    images = np.arange(2 * 28 * 28, dtype=np.uint8).reshape(2, 28, 28)
    zoo.save_samples(tmp_path / "s.npz", images, [4, 1])
    with np.load(tmp_path / "s.npz", allow_pickle=False) as f:
        assert sorted(f.files) == ["images", "labels"]
        assert f["images"].shape == (2, 28, 28, 1) and f["images"].dtype == np.uint8
        assert f["labels"].dtype == np.int64
    loaded, labels = zoo.load_samples(tmp_path / "s.npz")
    assert np.array_equal(loaded[..., 0], images) and labels.tolist() == [4, 1]
    zoo.save_samples(tmp_path / "u.npz", images[..., None])
    assert zoo.load_samples(tmp_path / "u.npz")[1] is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.npz", "u.npz"]
    with pytest.raises(ValueError, match="'images'"):
        zoo.save_samples(tmp_path / "x.npz", images.astype(np.float32))


@pytest.mark.parametrize("family, knob", [("cgan", {"truncation": 0.7}),
                                          ("vae", {"temperature": 0.7})])
def test_dispatch_and_state_files(tmp_path, toy, family, knob):
    state = zoo.train(family, *toy, seed=1, steps=2, batch_size=16, width=4)
    zoo.save_state(tmp_path / "m.pt", state)
    loaded = zoo.load_state(tmp_path / "m.pt")  # weights_only=True inside
    assert loaded["family"] == family and loaded["config"] == state["config"]
    images, labels = zoo.sample(loaded, 12, seed=0, **knob)
    assert images.shape == (12, 28, 28) and labels.shape == (12,)
    with pytest.raises(ValueError, match="'family'"):
        zoo.train("diffusion", *toy, seed=1)


def test_torch_session_restores_global_state():
    threads = torch.get_num_threads()
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    with zoo.torch_session(seed=0, threads=1):
        inside = torch.rand(3)
        assert torch.get_num_threads() == 1
        assert torch.are_deterministic_algorithms_enabled()
    assert torch.equal(torch.rand(3), expected)
    assert torch.get_num_threads() == threads
    assert not torch.are_deterministic_algorithms_enabled()
    with zoo.torch_session(seed=0):
        assert torch.equal(torch.rand(3), inside)
