"""FedAvg training of the zoo's cGAN (training.fedavg) and the server average."""

import numpy as np
import pytest
import torch

from distrank.training.fedavg import train_cgan_central, train_cgan_fedavg, zoo_defaults
from distrank.training.federated import (
    Shard,
    average_states,
    client_seed,
    client_shards,
    momentum_step,
)
from distrank.training.resume import Checkpoints
from distrank.zoo import load_state, sample, torch_session
from distrank.zoo.cgan import Discriminator, Generator, train_cgan, train_step
from distrank.zoo.families import to_float

NET = {"z_dim": 8, "width": 8}


def test_train_step_is_the_zoos_training_step(toy):
    """train_step driven as train_cgan drives its loop gives train_cgan's weights, bit for bit."""
    images, labels = toy
    steps, bs = 12, 16  # 12 * 16 > 160 images: one reshuffle
    state = train_cgan(images, labels, seed=3, steps=steps, batch_size=bs, threads=1, **NET)
    x_all, y_all = to_float(images), torch.from_numpy(labels.astype(np.int64))
    d = zoo_defaults()
    with torch_session(3, 1):
        gen, disc = Generator(8, 10, 8, 28), Discriminator(10, 8, 28)
        opt_g = torch.optim.Adam(gen.parameters(), lr=d["lr_g"], betas=(0.0, 0.9))
        opt_d = torch.optim.Adam(disc.parameters(), lr=d["lr_d"], betas=(0.0, 0.9))
        rng = torch.Generator().manual_seed(3)
        order, pos = torch.randperm(len(x_all), generator=rng), 0
        for _ in range(steps):
            if pos + bs > len(order):
                order, pos = torch.randperm(len(x_all), generator=rng), 0
            idx, pos = order[pos : pos + bs], pos + bs
            z = torch.randn(bs, 8, generator=rng)
            train_step(gen, disc, opt_g, opt_d, x_all[idx], y_all[idx], z)
    for key, value in gen.state_dict().items():
        assert torch.equal(value, state["generator"][key]), key


def test_average_states_is_the_weighted_mean():
    a = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(5)}
    b = {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor(5)}
    out = average_states([a, b], [0.25, 0.75])
    assert torch.equal(out["w"], torch.tensor([2.5, 5.0])) and out["w"].dtype == torch.float32
    assert out["n"].item() == 5
    with pytest.raises(ValueError, match="integer tensor 'n'"):
        average_states([a, {**b, "n": torch.tensor(6)}], [0.5, 0.5])
    with pytest.raises(ValueError, match=r"^weights: expected one weight per state"):
        average_states([a, b], [1.0])


def test_client_shards_split_rows_and_skip_unassigned(toy):
    images, labels = toy
    clients = np.where(labels < 3, 0, np.where(labels < 9, 1, -1))
    shards = client_shards(images, labels, clients)
    assert [len(s) for s in shards] == [48, 96]
    assert np.array_equal(shards[1].images, images[(labels >= 3) & (labels < 9)])
    with pytest.raises(ValueError, match="ids 0..k-1"):
        client_shards(images, labels, np.where(clients >= 0, clients + 1, -1))


def test_one_round_is_the_weighted_average_of_the_clients_local_training(
    toy, toy_clients, tmp_path
):
    """Round 1 by hand: every client from the same initial networks, its own stream
    (client_seed), local_steps zoo steps on its own images; then lambda_i = n_i / n."""
    images, labels = toy
    shards = client_shards(images, labels, toy_clients)
    seed, steps, bs = 5, 3, 8
    (got,) = train_cgan_fedavg(
        shards,
        seed=seed,
        rounds=1,
        local_steps=steps,
        batch_size=bs,
        checkpoint_dir=tmp_path,
        threads=1,
        **NET,
    )
    d = zoo_defaults()
    with torch_session(seed, 1):
        init_g, init_d = Generator(8, 10, 8).state_dict(), Discriminator(10, 8).state_dict()
        states = []
        for i, shard in enumerate(shards):
            gen, disc = Generator(8, 10, 8), Discriminator(10, 8)
            gen.load_state_dict(init_g)
            disc.load_state_dict(init_d)
            opt_g = torch.optim.Adam(gen.parameters(), lr=d["lr_g"], betas=(0.0, 0.9))
            opt_d = torch.optim.Adam(disc.parameters(), lr=d["lr_d"], betas=(0.0, 0.9))
            rng = torch.Generator().manual_seed(client_seed(seed, i))
            order = torch.randperm(len(shard), generator=rng)
            x, y = to_float(shard.images), torch.from_numpy(shard.labels)
            for t in range(steps):
                idx = order[t * bs : (t + 1) * bs]
                train_step(
                    gen, disc, opt_g, opt_d, x[idx], y[idx], torch.randn(bs, 8, generator=rng)
                )
            states.append(gen.state_dict())
    sizes = np.array([len(s) for s in shards])
    want = average_states(states, sizes / sizes.sum())
    assert got["round"] == 1 and got["family"] == "cgan"
    for key, value in want.items():
        assert torch.equal(got["generator"][key], value), key


def test_checkpoints_every_round_and_central_takes_the_same_steps(toy, toy_clients, tmp_path):
    images, labels = toy
    shards = client_shards(images, labels, toy_clients)
    kwargs = {"seed": 0, "rounds": 3, "local_steps": 2, "batch_size": 8, "threads": 1, **NET}
    fed = train_cgan_fedavg(shards, checkpoint_dir=tmp_path / "fed", **kwargs)
    central = train_cgan_central(shards, checkpoint_dir=tmp_path / "central", **kwargs)
    assert [s["round"] for s in fed] == [s["round"] for s in central] == [1, 2, 3]
    for state in fed + central:
        images_out, _ = sample(state, 20, seed=1)
        assert images_out.shape == (20, 28, 28)
    # Adam's step counts: each client 3 x 2; the central run 3 x (3 clients x 2)
    fed_resume = load_state(tmp_path / "fed" / "resume.pt")
    central_resume = load_state(tmp_path / "central" / "resume.pt")
    assert [int(c["opt_g"]["state"][0]["step"]) for c in fed_resume["clients"]] == [6, 6, 6]
    assert [int(c["opt_g"]["state"][0]["step"]) for c in central_resume["clients"]] == [18]
    # the same initial networks, then different trainings
    first = {k: v for k, v in fed[0]["generator"].items() if v.is_floating_point()}
    assert any(not torch.equal(v, central[0]["generator"][k]) for k, v in first.items())


def test_a_run_is_deterministic_and_a_changed_setting_does_not_resume(toy, toy_clients, tmp_path):
    images, labels = toy
    shards = client_shards(images, labels, toy_clients)
    kwargs = {"seed": 0, "rounds": 2, "local_steps": 1, "batch_size": 8, "threads": 1, **NET}
    a = train_cgan_fedavg(shards, checkpoint_dir=tmp_path / "a", **kwargs)
    b = train_cgan_fedavg(shards, checkpoint_dir=tmp_path / "b", **kwargs)
    assert all(torch.equal(v, b[-1]["generator"][k]) for k, v in a[-1]["generator"].items())
    # same folder, another seed: the old checkpoints are not reused
    c = train_cgan_fedavg(shards, checkpoint_dir=tmp_path / "a", **{**kwargs, "seed": 1})
    assert any(not torch.equal(v, c[-1]["generator"][k]) for k, v in a[-1]["generator"].items())


def test_checkpoints_folder_is_cleared_on_another_fingerprint(tmp_path):
    store = Checkpoints(tmp_path, {"seed": 0})
    store.save(1, {"x": torch.zeros(1)}, {"y": 1})
    assert Checkpoints(tmp_path, {"seed": 0}).resume()["point"] == 1
    assert Checkpoints(tmp_path, {"seed": 1}).resume() is None
    assert not store.path(1).exists()


def test_argument_checks(toy):
    images, labels = toy
    shard = Shard(images[:10], labels[:10])
    with pytest.raises(ValueError, match=r"batch_size \(16\) exceeds client 0's 10 images"):
        train_cgan_fedavg(
            [shard], seed=0, rounds=1, local_steps=1, batch_size=16, checkpoint_dir="unused"
        )
    with pytest.raises(ValueError, match=r"^rounds: expected an integer >= 1"):
        train_cgan_fedavg([shard], seed=0, rounds=0, local_steps=1, checkpoint_dir="unused")


def test_momentum_step_is_fedavgm():
    """v1 = avg1 - w0, w1 = w0 + v1; v2 = beta v1 + (avg2 - w1), w2 = w1 + v2; the
    buffer (not in names) takes the average."""
    w0 = {"p": torch.tensor([0.0, 1.0]), "buf": torch.tensor([5.0])}
    avg1 = {"p": torch.tensor([1.0, 1.0]), "buf": torch.tensor([6.0])}
    w1, v1 = momentum_step(w0, avg1, None, 0.9, ["p"])
    assert w1["p"].tolist() == [1.0, 1.0] and v1["p"].tolist() == [1.0, 0.0]
    avg2 = {"p": torch.tensor([1.5, 0.0]), "buf": torch.tensor([7.0])}
    w2, v2 = momentum_step(w1, avg2, v1, 0.9, ["p"])
    assert v2["p"].tolist() == pytest.approx([0.5 + 0.9, -1.0])
    assert w2["p"].tolist() == pytest.approx([2.4, 0.0])
    assert w2["buf"].tolist() == [7.0] and set(v2) == {"p"}


def test_server_momentum_starts_as_fedavg_then_differs(toy, toy_clients, tmp_path):
    images, labels = toy
    shards = client_shards(images, labels, toy_clients)
    kwargs = {"seed": 0, "local_steps": 1, "batch_size": 8, "threads": 1, **NET}
    plain = train_cgan_fedavg(shards, rounds=3, checkpoint_dir=tmp_path / "p", **kwargs)
    kwargs["server_momentum"] = 0.5
    whole = train_cgan_fedavg(shards, rounds=3, checkpoint_dir=tmp_path / "w", **kwargs)
    # round 1 starts with no velocity: the same as plain FedAvg; then it differs
    assert all(torch.equal(v, plain[0]["generator"][k]) for k, v in whole[0]["generator"].items())
    assert any(
        not torch.equal(v, plain[2]["generator"][k]) for k, v in whole[2]["generator"].items()
    )
    with pytest.raises(ValueError, match=r"^server_momentum: expected a number in \[0, 1\)"):
        train_cgan_fedavg(
            shards, rounds=1, checkpoint_dir=tmp_path / "x", **{**kwargs, "server_momentum": 1}
        )
