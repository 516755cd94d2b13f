"""Zoo persistence, dispatch and the torch session (distrank.zoo)."""

import pytest
import torch

from distrank import zoo


@pytest.mark.parametrize(
    "family, knob", [("cgan", {"truncation": 0.7}), ("vae", {"temperature": 0.7})]
)
def test_dispatch_and_state_files(tmp_path, toy, family, knob):
    state = zoo.train(family, *toy, seed=1, steps=2, batch_size=16, width=4)
    zoo.save_state(tmp_path / "m.pt", state)
    loaded = zoo.load_state(tmp_path / "m.pt")  # weights_only=True inside
    assert loaded["family"] == family and loaded["config"] == state["config"]
    images, labels = zoo.sample(loaded, 12, seed=0, **knob)
    assert images.shape == (12, 28, 28) and labels.shape == (12,)
    with pytest.raises(ValueError, match=r"^argument 'family': unknown 'flow'"):
        zoo.train("flow", *toy, seed=1)


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
