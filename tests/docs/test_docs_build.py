"""The documentation builds in strict mode and holds what a reader needs, read from the
built pages' parsed text (not their source files)."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


class Text(HTMLParser):
    """The visible text of an HTML page's main article, its headings and API entries."""

    SKIP = {"script", "style", "template"}

    def __init__(self):
        super().__init__()
        self.depth, self.skip, self.chunks, self.headings, self._heading = 0, 0, [], [], None
        self.objects: set[str] = set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "dt" and "sig-object" in (attrs.get("class") or "").split() and attrs.get("id"):
            self.objects.add(attrs["id"])  # an API entry: <dt class="sig sig-object py" id=...>
        if tag == "article":
            self.depth += 1
        if tag in self.SKIP:
            self.skip += 1
        if self.depth and re.fullmatch(r"h[1-3]", tag):
            self._heading = []

    def handle_endtag(self, tag):
        if tag == "article":
            self.depth -= 1
        if tag in self.SKIP:
            self.skip -= 1
        if self._heading is not None and re.fullmatch(r"h[1-3]", tag):
            self.headings.append(" ".join("".join(self._heading).split()).rstrip("#¶ "))
            self._heading = None

    def handle_data(self, data):
        if self.depth and not self.skip:
            self.chunks.append(data)
            if self._heading is not None:
                self._heading.append(data)

    @property
    def text(self) -> str:
        return " ".join("".join(self.chunks).split())


def page(out: Path, name: str) -> Text:
    parser = Text()
    parser.feed((out / name).read_text())
    return parser


def test_the_strict_build_passes_without_a_warning(build):
    run, out, seconds = build
    assert run.returncode == 0, (run.stdout + run.stderr)[-5000:]
    assert "WARNING" not in run.stderr and "ERROR" not in run.stderr, run.stderr[-5000:]
    assert (out / "index.html").is_file()
    print(f"docs build: {seconds:.1f} s")


def test_every_experiment_has_its_page_with_claim_caption_and_config(build):
    _, out, _ = build
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    keys = [*config["experiments"], "A1", "A2", "A3", "A4", "A5", "A6"]
    for key in keys:
        shown = page(out, f"experiments/{key}.html")
        assert shown.headings[0].startswith(f"{key}: "), shown.headings
        for section in ("How to read it", "What it writes", "Its config section", "The method"):
            assert section in shown.headings, (key, shown.headings)
        assert "The claim." in shown.text
    # the config section is the default study's, cut at the right key
    e9 = page(out, "experiments/E9.html").text
    assert "epsilons: [0.1, 0.3, 1, 3, 10, 30, 100, 300, 1000]" in e9 and "E10:" not in e9
    # the caption is rendered with the default config's values, as snakemake --report does
    a1 = page(out, "experiments/A1.html").text
    stacking = config["agreement"]["stacking"]
    assert f"({stacking['n_pairs']} pairs a point)" in a1 and "snakemake.config" not in a1


def test_the_api_reference_documents_the_public_faces_and_not_the_internal_ones(build):
    import importlib

    _, out, _ = build
    documented = set()
    for html in (out / "api").glob("*.html"):
        documented |= page(out, f"api/{html.name}").objects
    for name in (
        "distrank.metrics.kd.kernel_distance",
        "distrank.metrics.fd.frechet_distance",
        "distrank.metrics.prdc.prdc",
        "distrank.metrics.score",
        "distrank.metrics.kd.kd_sensitivity",
        "distrank.clients.partition",
        "distrank.features.base.Extractor",
        "distrank.zoo.torch_session",
        "distrank.metrics.rank_agreement",
        "distrank.metrics.ScoreOptions",
        "distrank.figures.metric_label",
    ):
        assert name in documented, name
    internal = {"distrank.cli", "distrank._arrays", "distrank._io"}  # the CLI: score.md
    assert not {n for n in documented if n.rsplit(".", 1)[0] in internal or n in internal}
    assert "distrank.clients.partition" in documented  # (not to be confused with cli)
    # distrank.metrics and its families: exactly what their faces export, nothing private
    metrics = {n for n in documented if n.startswith("distrank.metrics")}
    assert not {n for n in metrics if any(p.startswith("_") for p in n.split("."))}
    for face in ("", ".kd", ".fd", ".prdc", ".sketch"):
        face = f"distrank.metrics{face}"
        exported = {f"{face}.{name}" for name in importlib.import_module(face).__all__}
        assert {n for n in metrics if n.rsplit(".", 1)[0] == face} == exported, face


def test_the_front_page_and_getting_started_say_the_two_commands(build):
    _, out, _ = build
    for name in ("index.html", "getting-started.html"):
        text = page(out, name).text
        assert "./setup.sh && .venv/bin/snakemake --cores all" in text
        assert "./setup.sh --test && .venv/bin/pytest" in text
    flower = page(out, "flower.html")
    assert "Secure mode" in flower.headings


@pytest.mark.parametrize("name", ["score.html", "reliability.html"])
def test_no_raw_markup_reaches_the_reader(build, name):
    _, out, _ = build
    text = page(out, name).text
    assert "```" not in text and "{func}" not in text and ":math:" not in text


def test_the_readme_front_page_shows_e1_and_links_only_to_pages_that_exist():
    markdown_it = pytest.importorskip("markdown_it")
    tokens = markdown_it.MarkdownIt().parse((REPO / "README.md").read_text())
    inline = [child for t in tokens if t.type == "inline" for child in t.children or []]
    images = [c.attrGet("src") for c in inline if c.type == "image"]
    links = [c.attrGet("href") for c in inline if c.type == "link_open"]
    assert images == ["docs/figures/E1_kd_consistency.png"]
    local = [href for href in links if "://" not in href]
    assert len(local) >= 8
    for href in [*images, *local]:
        assert (REPO / href.split("#")[0]).is_file(), href
    commands = [t.content for t in tokens if t.type in ("code_block", "fence")]
    assert any("./setup.sh && .venv/bin/snakemake --cores all" in c for c in commands)
    assert any(c.startswith("distrank score") and "distrank report" in c for c in commands)
