"""The report pages in a real browser: Debian's chromium, headless, driven over the
DevTools protocol (https://chromedevtools.github.io/devtools-protocol/).

Two pages: `distrank report`'s consistency page, and the `snakemake --report` page of a
tiny workflow (a temporary folder with two figures of the pipeline's kind). From the
rendered page, every figure must have loaded (decoded, with a size) and the key numbers
must be on screen; no request may leave the machine. Screenshots go to the test's temp
folder, or to $DISTRANK_SCREENSHOTS when set (to look at them).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import shutil
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from textkit import shows_rounded

websockets = pytest.importorskip("websockets.sync.client")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (./setup.sh --test, as root)"
)
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


class Browser:
    """One headless chromium with one page, spoken to over a DevTools websocket."""

    def __init__(self, profile: Path, timeout: float = 60.0):
        self.timeout, self.events, self._id = timeout, [], 0
        self.proc = subprocess.Popen(
            [
                CHROMIUM,
                *FLAGS,
                f"--user-data-dir={profile}",
                "--remote-debugging-port=0",
                "--window-size=1280,900",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        port = self._devtools_port()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            page = next(t for t in json.load(r) if t["type"] == "page")
        self._stack = contextlib.ExitStack()
        self.ws = self._stack.enter_context(
            websockets.connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=timeout)
        )
        for domain in ("Page", "Runtime", "Network"):
            self.send(f"{domain}.enable")

    def _devtools_port(self) -> int:
        deadline, seen = time.monotonic() + self.timeout, []
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stderr], [], [], 1.0)
            if ready:
                line = self.proc.stderr.readline()
                seen.append(line)
                if "DevTools listening on ws://" in line:
                    return int(line.split("ws://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
            if self.proc.poll() is not None:
                break
        raise RuntimeError("chromium did not start:\n" + "".join(seen))

    def send(self, method: str, **params):
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv(timeout=self.timeout))
            if message.get("id") == self._id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]
            self.events.append(message)

    def open(self, url: str) -> None:
        self.events.clear()
        self.send("Page.navigate", url=url)
        self.wait(
            lambda: any(e.get("method") == "Page.loadEventFired" for e in self.events),
            poll=lambda: self.send("Runtime.evaluate", expression="1"),
        )

    def eval(self, expression: str):
        result = self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}...: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait(self, done, poll=None) -> None:
        deadline = time.monotonic() + self.timeout
        while not done():
            if time.monotonic() > deadline:
                raise TimeoutError("the page did not get there in time")
            (poll or (lambda: None))()
            time.sleep(0.1)

    def requests(self) -> list[str]:
        return [
            e["params"]["request"]["url"]
            for e in self.events
            if e.get("method") == "Network.requestWillBeSent"
        ]

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(data["data"]))
        return path

    def close(self) -> None:
        self._stack.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture
def browser(tmp_path):
    profile = tmp_path / "profile"
    profile.mkdir()  # a new, empty profile: nothing from earlier runs
    b = Browser(profile)
    yield b
    b.close()


@pytest.fixture
def shots(tmp_path):
    folder = Path(os.environ.get("DISTRANK_SCREENSHOTS") or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


IMAGES_LOADED = """Array.from(document.images).map(i => ({complete: i.complete,
    width: i.naturalWidth, height: i.naturalHeight, shown: i.getBoundingClientRect().width}))"""


def assert_images_loaded(browser, count):
    images = browser.eval(IMAGES_LOADED)
    assert len(images) == count, images
    for image in images:
        assert image["complete"] and image["width"] > 100 and image["height"] > 100, image
        assert image["shown"] > 100, image  # laid out, not hidden


def assert_local(browser):
    remote = [u for u in browser.requests() if not u.startswith(("file:", "data:", "about:"))]
    assert remote == []


def test_distrank_report_page_renders_every_figure_and_number(browser, shots, tmp_path):
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    from distrank.cli import main

    rng = np.random.default_rng(5)
    clients = np.repeat(np.array(["north", "south", "east"]), [40, 30, 30])
    x = rng.normal(size=(100, 4)) + (clients == "south")[:, None] * 2.0
    np.savez(tmp_path / "ref.npz", features=x, clients=clients)
    args = []
    for name, (mean, sd) in {
        "good": (0.5, 1.2),
        "bad": (3.0, 0.3),
        "odd": (-1.0, 2.0),
        "tight": (0.7, 0.6),
    }.items():
        np.savez(tmp_path / f"{name}.npz", features=rng.normal(mean, sd, (60, 4)))
        args += ["--model", f"{name}={tmp_path / f'{name}.npz'}"]
    scores = tmp_path / "scores.csv"
    assert (
        main(
            [
                "score",
                "--reference",
                str(tmp_path / "ref.npz"),
                *args,
                "--dtype",
                "float64",
                "--out",
                str(scores),
                "-q",
            ]
        )
        == 0
    )
    assert main(["report", str(scores), "--out", str(tmp_path / "report.html")]) == 0

    browser.open((tmp_path / "report.html").as_uri())
    assert_images_loaded(browser, 2)
    table = pd.read_csv(scores, keep_default_na=False)
    shown = browser.eval("""Object.fromEntries(Array.from(
        document.querySelectorAll('td[data-aggregation]')).map(td => [
        [td.dataset.model, td.dataset.metric, td.dataset.aggregation].join('|'),
        td.innerText.split(' ')[0]]))""")
    pooled = table[table.aggregation.isin(["all", "avg"])]
    assert len(shown) == len(pooled)
    for row in pooled.itertuples():  # four significant digits; the CSV keeps them all
        assert shows_rounded(shown[f"{row.model}|{row.metric}|{row.aggregation}"], row.value)
    wide = pooled.pivot_table(index="model", columns=["metric", "aggregation"], values="value")
    gap = float((wide["kd"]["avg"] - wide["kd"]["all"]).mean())
    assert shows_rounded(browser.eval("document.querySelector('.gap').innerText"), gap)
    verdicts = browser.eval("""Object.fromEntries(Array.from(document.querySelectorAll(
        '.consistency tr[data-metric]')).map(tr => [tr.dataset.metric,
        [tr.querySelector('.verdict').innerText, tr.querySelector('.tau').innerText]]))""")
    assert verdicts["kd"] == ["safe", "+1.000"] and verdicts["recall"][0] == "exact"
    lines = shown_lines(browser)
    assert "Which metrics are safe to average across clients" in lines
    assert "Where avg and all disagree: model pairs that flip" in lines
    assert_local(browser)
    browser.send(
        "Emulation.setDeviceMetricsOverride",
        width=1200,
        height=900,
        deviceScaleFactor=1,
        mobile=False,
    )
    assert browser.eval("window.innerWidth") == 1200
    tables = browser.eval(TABLE_WIDTHS)
    assert len(tables) == 2 + 6  # scores, verdicts, one per metric of the clients
    for table in tables:  # no table, nor its box, needs a horizontal scroll bar
        assert table["width"] <= table["box"] and table["content"] <= table["box"], table
    assert browser.eval("document.documentElement.scrollWidth <= window.innerWidth")
    browser.screenshot(shots / "distrank_report.png")


#: Each table's width, and its container's visible and full (scrolled) width, in px.
TABLE_WIDTHS = """Array.from(document.querySelectorAll('table')).map(t => ({
    table: t.className || t.dataset.metric, width: t.scrollWidth,
    box: t.parentElement.clientWidth, content: t.parentElement.scrollWidth}))"""


SNAKEFILE = """\
rule all:
    input:
        "figures/E1_demo.png",
        "figures/E6_demo.png",


for key in ("E1", "E6"):

    rule:
        name:
            f"figure_{key}"
        output:
            report(f"figures/{key}_demo.png", caption=f"captions/{key}.rst", category=key),
        params:
            gap=0.1982,
            key=key,
        script:
            "figure.py"
"""

FIGURE_SCRIPT = """\
import pandas as pd
from distrank.figures import e1_figure, e1_table, e6_figure, e6_table, save

rows = []
for i, model in enumerate(["a", "b", "c", "d"]):
    for metric, all_, avg in (("kd", 0.1 * i, 0.1 * i + snakemake.params.gap),
                              ("fd", 10.0 * i, 12.0 * i - 5 * (i == 2)),
                              ("precision", 0.9 - 0.1 * i, 0.85 - 0.1 * i),
                              ("recall", 0.5 + 0.1 * i, 0.5 + 0.1 * i),
                              ("density", 1.0 - 0.2 * i, 0.9 - 0.1 * i),
                              ("coverage", 0.6 + 0.05 * i, 0.7 - 0.02 * i)):
        rows += [(model, metric, "all", "", all_), (model, metric, "avg", "", avg)]
scores = pd.DataFrame(rows, columns=["model", "metric", "aggregation", "client", "value"])
if snakemake.params.key == "E1":
    figure = e1_figure(e1_table(scores)[0], "efficientnet_lite0")
else:
    figure = e6_figure(e6_table(scores)[0], "efficientnet_lite0")
save(figure, snakemake.output[0][: -len(".png")])
"""


def shown_lines(browser) -> list[str]:
    """The page's rendered text (innerText), one stripped entry per line."""
    return [line.strip() for line in browser.eval("document.body.innerText").splitlines()]


def test_snakemake_report_page_renders_every_figure_and_caption(browser, shots, tmp_path):
    work = tmp_path / "workflow"
    (work / "captions").mkdir(parents=True)
    (work / "Snakefile").write_text(SNAKEFILE)
    (work / "figure.py").write_text(FIGURE_SCRIPT)
    for name in ("E1", "E6"):
        (work / "captions" / f"{name}.rst").write_text(
            textwrap.dedent(f"""\
            {name} demo figure: the KD gap is {{{{ snakemake.params.gap }}}} for every model.
            """)
        )
    snakemake = [
        str(Path(sys.executable).with_name("snakemake")),
        "--cores",
        "1",
        "-d",
        str(work),
        "-s",
        str(work / "Snakefile"),
    ]
    for extra in ([], ["--report", str(work / "report.html")]):
        done = subprocess.run(snakemake + extra, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]

    browser.open((work / "report.html").as_uri())
    browser.wait(
        lambda: browser.eval(
            "typeof app !== 'undefined' && document.querySelector('#app').innerText.length > 0"
        )
    )
    results = browser.eval(
        "Object.fromEntries(Object.entries(results).map(([k, v]) => [k, [v.mime_type, v.caption]]))"
    )
    assert sorted(Path(p).name for p in results) == ["E1_demo.png", "E6_demo.png"]
    for path, (mime, _) in results.items():
        assert mime == "image/png"
        name = Path(path).name.split("_")[0]
        # what the result's eye button does: show the embedded image in the content pane
        browser.eval(
            f"app.setView({{content: 'img', resultPath: {json.dumps(path)}, "
            f"contentPath: results[{json.dumps(path)}].data_uri}})"
        )
        browser.wait(
            lambda: browser.eval(
                "Array.from(document.images).some(i => "
                "i.src.startsWith('data:image/png') && i.complete)"
            )
        )
        shown = [i for i in browser.eval(IMAGES_LOADED) if i["width"] > 100]
        assert len(shown) == 1 and shown[0]["complete"] and shown[0]["shown"] > 100, shown
        browser.eval(f"app.showResultInfo({json.dumps(path)})")
        caption = f"{name} demo figure: the KD gap is 0.1982 for every model."
        browser.wait(lambda caption=caption: caption in shown_lines(browser))
        browser.screenshot(shots / f"snakemake_report_{name}.png")
    assert_local(browser)
