"""`distrank sketch` at three sites and `distrank rank` at the server, on folders of real
Fashion-MNIST PNGs, as a user would run them: without noise the ranking equals `distrank
score`'s KD ranking with the same rbf kernel (pooled and averaged), the values agree to
the sketch's error, the report reads the table, and sketches of different maps are refused
naming the field."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from scipy.spatial.distance import pdist
from textkit import cli_error

from distrank.cli import EXIT_INPUT, main
from distrank.data.fashion_mnist import load_fashion_mnist

torch = pytest.importorskip("torch")

SITES = {"north": (0, 1, 2), "south": (3, 4, 5), "east": (6, 7, 8, 9)}
ROWS = 40
EXTRACTOR = ["--extractor", "efficientnet_lite0", "--backend", "torch", "--device", "cpu"]


def save_folder(folder, images):
    folder.mkdir(parents=True)
    for i, img in enumerate(images):
        Image.fromarray(img).save(folder / f"{i:03d}.png")


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """reference/<site>/*.png, models/<name>/*.png, and a bandwidth from the server's side
    (the median distance of the 'real' model's features: never the sites')."""
    root = tmp_path_factory.mktemp("sketch")
    images, labels = load_fashion_mnist("test")
    for site, classes in SITES.items():
        save_folder(
            root / "reference" / site, images[np.flatnonzero(np.isin(labels, classes))[:ROWS]]
        )
    rng = np.random.default_rng(0)
    held_out = images[5000 : 5000 + ROWS]
    noisy = np.clip(held_out + rng.normal(0, 60, held_out.shape), 0, 255).astype(np.uint8)
    save_folder(root / "models" / "real", held_out)
    save_folder(root / "models" / "noisy", noisy)
    save_folder(root / "models" / "shirts", images[np.flatnonzero(labels == 6)[-ROWS:]])
    cache = ["--cache-dir", str(root / "cache")]
    assert (
        main(
            [
                "extract",
                str(root / "models" / "real"),
                "--out",
                str(root / "real.npz"),
                *EXTRACTOR,
                *cache,
                "--quiet",
            ]
        )
        == 0
    )
    bandwidth = float(np.median(pdist(np.load(root / "real.npz")["features"])))
    return root, cache, bandwidth


def models(root):
    return [
        a for m in ("real", "noisy", "shirts") for a in ("--model", f"{m}={root / 'models' / m}")
    ]


def ranking(path, aggregation, metric):
    table = pd.read_csv(path, keep_default_na=False)
    rows = table[(table.metric == metric) & (table.aggregation == aggregation)]
    return rows.sort_values("value").model.tolist(), rows.set_index("model").value


def test_sketches_rank_as_distrank_score_and_the_report_reads_them(study, tmp_path):
    root, cache, bandwidth = study
    sketches = []
    for site in SITES:
        sketches.append(tmp_path / f"{site}.sketch.npz")
        args = ["sketch", "--reference", str(root / "reference" / site), "--out", str(sketches[-1])]
        args += ["--dim", "8192", "--seed", "5", "--bandwidth", str(bandwidth)]
        assert main([*args, *EXTRACTOR, *cache, "--quiet"]) == 0
    ranked, scored = tmp_path / "ranked.csv", tmp_path / "scored.csv"
    args = ["rank", "--sketch", *map(str, sketches), *models(root), "--out", str(ranked)]
    assert main([*args, *EXTRACTOR, *cache, "--quiet"]) == 0
    args = ["score", "--reference", str(root / "reference"), *models(root), "--out", str(scored)]
    args += ["--metric", "kd", "--kernel", "rbf", "--kernel-param", f"bandwidth={bandwidth}"]
    assert main([*args, "--dtype", "float64", *EXTRACTOR, *cache, "--quiet"]) == 0
    for aggregation in ("all", "avg"):
        ours, values = ranking(ranked, aggregation, "kd_sketch")
        theirs, exact = ranking(scored, aggregation, "kd")
        assert ours == theirs and len(ours) == 3
        gap = np.abs(values[ours].to_numpy() - exact[ours].to_numpy())
        assert gap.max() < 0.1 * np.diff(exact[ours].to_numpy()).min()  # far below the gaps
    clients = pd.read_csv(ranked, keep_default_na=False).query("aggregation == 'client'")
    assert sorted(set(clients.client)) == sorted(SITES)
    page = tmp_path / "report.html"
    assert main(["report", str(ranked), "--out", str(page)]) == 0 and page.stat().st_size > 0


def test_sketches_of_different_maps_are_refused_naming_the_field(study, tmp_path, capsys):
    root, cache, bandwidth = study
    paths = []
    for site, dim in (("north", "512"), ("south", "1024")):
        paths.append(tmp_path / f"{site}.sketch.npz")
        args = ["sketch", "--reference", str(root / "reference" / site), "--out", str(paths[-1])]
        assert (
            main(
                [
                    *args,
                    "--dim",
                    dim,
                    "--seed",
                    "5",
                    "--bandwidth",
                    str(bandwidth),
                    *EXTRACTOR,
                    *cache,
                    "--quiet",
                ]
            )
            == 0
        )
    capsys.readouterr()
    out = tmp_path / "ranked.csv"
    args = ["rank", "--sketch", *map(str, paths), *models(root), "--out", str(out)]
    assert main([*args, *EXTRACTOR, *cache, "--quiet"]) == EXIT_INPUT
    assert "field 'dim' differs" in cli_error(capsys.readouterr().err) and not out.exists()
