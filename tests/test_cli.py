"""`distrank score` on feature files: the table it writes (csv, json, markdown), what it
prints, the defaults it takes from the library, and the errors that leave no file."""

import inspect
import json
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from textkit import cli_error, markdown_tables, visible_lines, words

from distrank.cli import EXIT_INPUT, build_parser, main
from distrank.metrics import ScoreOptions, score
from distrank.metrics._metric import METRIC_KEYS


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny inputs; LAPACK threads only contend on a busy machine
    yield
    torch.set_num_threads(saved)


RNG = np.random.default_rng(7)
D = 4


@pytest.fixture
def files(tmp_path):
    clients = np.array(["north", "south", "east"])[RNG.integers(0, 3, size=90)]
    x = RNG.normal(size=(90, D)) + (clients == "south")[:, None] * 2.0
    models = {
        "good": RNG.normal(0.5, 1.2, size=(60, D)),
        "bad": RNG.normal(3.0, 0.3, size=(50, D)),
        "odd": RNG.normal(-1.0, 2.0, size=(40, D)),
    }
    np.savez(tmp_path / "ref.npz", features=x.astype(np.float32), clients=clients)
    for name, y in models.items():
        np.savez(tmp_path / f"{name}.npz", features=y.astype(np.float32))
    return tmp_path


def model_args(path, names=("good", "bad", "odd")):
    return [a for n in names for a in ("--model", f"{n}={path / (n + '.npz')}")]


def test_score_writes_the_tidy_table_and_prints_a_summary(files, capsys):
    out = files / "out" / "scores.csv"
    status = main(
        [
            "score",
            "--reference",
            str(files / "ref.npz"),
            *model_args(files),
            "--dtype",
            "float64",
            "--out",
            str(out),
        ]
    )
    assert status == 0
    table = pd.read_csv(out, keep_default_na=False)
    assert list(table.columns) == ["model", "metric", "aggregation", "client", "value"]
    with np.load(files / "ref.npz") as ref:
        models = {n: np.load(files / f"{n}.npz")["features"] for n in ("good", "bad", "odd")}
        expected = score(ref["features"], ref["clients"], models, dtype="float64")
    pd.testing.assert_frame_equal(table, expected, check_exact=False, rtol=1e-12)
    printed = capsys.readouterr().out.splitlines()
    taus = {}
    for line in printed[printed.index(KENDALL) + 1 :]:
        if not line.strip():
            break
        metric, tau = line.split(maxsplit=1)
        taus[metric] = tau
    assert list(taus) == list(dict.fromkeys(table.metric))  # kd ... coverage
    assert taus["kd"] == "+1.000"  # KD ranks the models the same way in both aggregations


def test_threads_caps_torch_and_blas_during_the_command_only(files, monkeypatch, capsys):
    import torch
    from threadpoolctl import threadpool_info

    from distrank.cli import score as score_command

    seen, scored = {}, score_command.scored

    def spy(*args, **kwargs):
        seen["torch"] = torch.get_num_threads()
        seen["blas"] = {lib["num_threads"] for lib in threadpool_info()}
        return scored(*args, **kwargs)

    monkeypatch.setattr(score_command, "scored", spy)
    torch.set_num_threads(2)
    try:
        ref, out = str(files / "ref.npz"), str(files / "scores.csv")
        args = ["score", "--reference", ref, *model_args(files), "--out", out]
        assert main([*args, "--threads", "1"]) == 0
        assert seen == {"torch": 1, "blas": {1}}
        assert torch.get_num_threads() == 2  # restored
        with pytest.raises(SystemExit):
            main([*args, "--threads", "0"])
        message = cli_error(capsys.readouterr().err, "score")
        assert message == "argument --threads: expected a positive integer, got '0'"
    finally:
        torch.set_num_threads(1)


KENDALL = "Kendall tau between the 'all' and 'avg' rankings of the models:"


def test_score_options_reach_the_metrics(files):
    out = files / "scores.csv"
    status = main(
        [
            "score",
            "--reference",
            str(files / "ref.npz"),
            *model_args(files),
            "--metric",
            "kd",
            "recall",
            "--kernel",
            "rbf",
            "--kernel-param",
            "bandwidth=1.5",
            "--kd-estimator",
            "biased",
            "--weights",
            "uniform",
            "--pr-k",
            "2",
            "--dtype",
            "float64",
            "--out",
            str(out),
        ]
    )
    assert status == 0
    table = pd.read_csv(out, keep_default_na=False)
    with np.load(files / "ref.npz") as ref:
        models = {n: np.load(files / f"{n}.npz")["features"] for n in ("good", "bad", "odd")}
        expected = score(
            ref["features"],
            ref["clients"],
            models,
            metrics=["kd", "recall"],
            kernel="rbf",
            kernel_params={"bandwidth": 1.5},
            kd_estimator="biased",
            weights="uniform",
            pr_k=2,
            dtype="float64",
        )
    pd.testing.assert_frame_equal(table, expected, check_exact=False, rtol=1e-12)


def broken(files, kind):
    """Write one bad input; return (arguments, how the error message must start)."""
    ref, good = files / "ref.npz", files / "good.npz"
    x = np.load(ref)["features"]
    if kind == "missing clients":
        np.savez(ref, features=x)
        return [], f"{ref}: no 'clients' array"
    if kind == "nan model":
        y = np.load(good)["features"]
        y[3, 1] = np.nan
        np.savez(good, features=y)
        return [], f"{good}: 'features' has NaN or infinite values in 1 rows"
    if kind == "dimension":
        np.savez(good, features=np.zeros((10, D + 2), np.float32))
        return [], f"{good}: 'features' has dimension 6, but the reference {ref} has 4"
    if kind == "empty model":
        np.savez(good, features=np.zeros((0, D), np.float32))
        return [], f"{good}: 'features' has shape (0, 4); expected non-empty (rows, d)"
    if kind == "missing file":
        good.unlink()
        return [], f"{good}: no such file or folder"
    if kind == "small client":
        clients = np.load(ref)["clients"]
        clients[:2] = "tiny"
        np.savez(ref, features=x, clients=clients)
        return ["--pr-k", "3"], f"{ref}: clients: client 'tiny' has 2 rows; "
    if kind == "clients length":
        np.savez(ref, features=x, clients=np.zeros(len(x) - 1, dtype=int))
        return [], f"{ref}: 'clients' has shape (89,); expected (90,)"
    raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind",
    [
        "missing clients",
        "nan model",
        "dimension",
        "empty model",
        "missing file",
        "small client",
        "clients length",
    ],
)
def test_bad_input_names_the_file_and_leaves_no_output(files, capsys, kind):
    extra, expected = broken(files, kind)
    out = files / "scores.csv"
    status = main(
        [
            "score",
            "--reference",
            str(files / "ref.npz"),
            *model_args(files),
            *extra,
            "--out",
            str(out),
        ]
    )
    assert status == EXIT_INPUT == 3
    message = cli_error(capsys.readouterr().err, "score")
    assert message.startswith(expected), message
    assert list(files.glob("*.csv")) == [] and list(files.glob(".scores*")) == []


def test_bad_model_spec_is_a_usage_error(files, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(
            [
                "score",
                "--reference",
                str(files / "ref.npz"),
                "--model",
                "nopath",
                "--out",
                str(files / "s.csv"),
            ]
        )
    assert exit_.value.code == 2
    assert "expected NAME=PATH" in cli_error(capsys.readouterr().err, "score")


def test_python_dash_m_distrank_runs_the_cli_and_documents_exit_codes():
    done = subprocess.run(
        [sys.executable, "-m", "distrank", "score", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert {"--reference", "--kd-estimator"} <= set(re.findall(r"--[\w-]+", done.stdout))
    assert "exit status:" in done.stdout.splitlines()
    for code in ("0", "1", "2", "3", "4", "130"):
        assert f"\n  {code} " in done.stdout
    top = subprocess.run(
        [sys.executable, "-m", "distrank", "--help"], capture_output=True, text=True, check=True
    )
    assert "exit status:" in top.stdout.splitlines()
    assert {"extract", "score", "report"} <= set(words(top.stdout))


def test_score_on_feature_files_imports_no_extractor_and_no_scipy_stats(files):
    """`-X importtime` lists every module a process imports: scoring feature files
    needs no image network (onnxruntime, timm, torchvision) and no scipy.stats."""
    out = files / "scores.csv"
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "distrank", "score", "-q"]
        + ["--reference", str(files / "ref.npz"), *model_args(files)]
        + ["--metric", "kd", "fd", "--out", str(out)],
        capture_output=True,
        text=True,
        check=True,
    )
    imported = {
        line.rsplit("|", 1)[1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    assert {"torch", "distrank.metrics.fd._frechet", "distrank.metrics.kd._sums"} <= imported
    roots = {name.split(".")[0] for name in imported}
    assert not {"onnxruntime", "timm", "torchvision", "sklearn"} & roots
    assert "scipy.stats" not in imported
    with np.load(files / "ref.npz") as ref:
        x, clients = ref["features"], ref["clients"]
    models = {n: np.load(files / f"{n}.npz")["features"] for n in ("good", "bad", "odd")}
    expected = score(x, clients, models, metrics=["kd", "fd"])
    table = pd.read_csv(out, keep_default_na=False)
    np.testing.assert_allclose(table.value, expected.value, rtol=1e-12)


def test_score_defaults_are_the_librarys():
    """Every scoring option has an argument whose default is ScoreOptions' (the schema
    and the Flower run config: tests/metrics/test_options.py)."""
    defaults = ScoreOptions.defaults()
    args = build_parser("score").parse_args(
        ["score", "--reference", "r.npz", "--model", "a=a.npz", "--out", "s.csv"]
    )
    assert args.metrics == list(defaults["metrics"]) == list(METRIC_KEYS)
    assert args.kernel_params == [] and defaults["kernel_params"] is None
    for name in set(ScoreOptions.names()) - {"metrics", "kernel_params"}:
        assert getattr(args, name) == defaults[name], name
    from distrank.features.base import get_extractor

    assert args.extractor == inspect.signature(get_extractor).parameters["name"].default


def test_clients_given_one_by_one_equal_the_reference_file(files):
    with np.load(files / "ref.npz") as ref:
        x, clients = ref["features"], ref["clients"]
    args = []
    for name in ("north", "south", "east"):
        np.savez(files / f"client_{name}.npz", features=x[clients == name])
        args += ["--client", f"{name}={files / f'client_{name}.npz'}"]
    main(
        [
            "score",
            *args,
            *model_args(files),
            "--dtype",
            "float64",
            "--out",
            str(files / "split.csv"),
        ]
    )
    main(
        [
            "score",
            "--reference",
            str(files / "ref.npz"),
            *model_args(files),
            "--dtype",
            "float64",
            "--out",
            str(files / "whole.csv"),
        ]
    )
    split = pd.read_csv(files / "split.csv", keep_default_na=False)
    whole = pd.read_csv(files / "whole.csv", keep_default_na=False)
    key = ["model", "metric", "aggregation", "client"]
    pd.testing.assert_frame_equal(
        split.sort_values(key).reset_index(drop=True),
        whole.sort_values(key).reset_index(drop=True),
        check_exact=False,
        rtol=1e-9,
    )


def test_json_and_markdown_formats(files, capsys):
    ref = ["score", "--reference", str(files / "ref.npz"), *model_args(files), "-q"]
    assert main([*ref, "--out", str(files / "s.csv")]) == 0
    table = pd.read_csv(files / "s.csv", keep_default_na=False)
    meta = json.loads((files / "s.csv.meta.json").read_text())
    assert meta["options"]["weights"] == "size" and meta["extractor"] is None
    labels = np.load(files / "ref.npz")["clients"]
    assert {c: v["n"] for c, v in meta["reference"].items()} == {
        c: int((labels == c).sum()) for c in np.unique(labels)
    }
    assert main([*ref, "--out", str(files / "s.json")]) == 0
    data = json.loads((files / "s.json").read_text())
    pd.testing.assert_frame_equal(pd.DataFrame(data["scores"]), table)
    assert data["meta"] == meta
    assert main([*ref, "--out", str(files / "s.txt"), "--format", "markdown"]) == 0
    text = (files / "s.txt").read_text()
    wide = table[table.aggregation == "all"].set_index(["model", "metric"])["value"]
    values, taus = markdown_tables(text)
    assert [row["model"] for row in values] == ["good", "bad", "odd"]
    assert values[0]["KD_all"] == f"{wide[('good', 'kd')]:.6g}"
    assert "Table: Kendall tau between the all and avg rankings" in text.splitlines()
    assert taus[0]["metric"] == "KD" and taus[0]["kendall_tau"] == "+1.000"
    capsys.readouterr()


def test_report_of_a_score_table_and_a_broken_one(files, capsys):
    out = files / "s.csv"
    assert (
        main(
            [
                "score",
                "--reference",
                str(files / "ref.npz"),
                *model_args(files),
                "-q",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert main(["report", str(out), "--out", str(files / "page.html")]) == 0
    page = (files / "page.html").read_text()
    lines = visible_lines(page)
    assert "Which metrics are safe to average across clients" in lines
    assert "metric safe to average? why measured on these models Kendall tau (avg vs all)" in lines
    bad = files / "bad.csv"
    bad.write_text("model,metric,aggregation,client,value\ngood,kd,all,,oops\n")
    assert main(["report", str(bad), "--out", str(files / "bad.html")]) == EXIT_INPUT
    assert f"{bad} line 2: 'value' is not a number" in capsys.readouterr().err
    assert not (files / "bad.html").exists()
