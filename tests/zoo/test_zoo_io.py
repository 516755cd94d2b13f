"""Zoo persistence, dispatch and the torch session (distrank.zoo)."""

import subprocess
import sys

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


def test_torch_session_sets_the_kernels_flag_without_loading_the_compiler():
    """As torch.use_deterministic_algorithms: the public getters read the flag, and
    torch.empty fills with NaN (its deterministic mode), yet torch._inductor, _dynamo
    and sympy stay unloaded in a fresh process (they cost 1.3 CPU-s a job)."""
    code = """if True:
        import sys, torch
        from distrank import zoo
        with zoo.torch_session(seed=0):
            on = torch.are_deterministic_algorithms_enabled()
            warn = torch.is_deterministic_algorithms_warn_only_enabled()
            nan = bool(torch.empty(64).isnan().all())
        zoo.deterministic_algorithms(True, warn_only=True)
        warn_after = torch.is_deterministic_algorithms_warn_only_enabled()
        loaded = [m for m in ("torch._inductor", "torch._dynamo", "sympy") if m in sys.modules]
        print(on, warn, nan, warn_after, torch.are_deterministic_algorithms_enabled(), loaded)
    """
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.split("\n")[0] == "True False True True True []"
