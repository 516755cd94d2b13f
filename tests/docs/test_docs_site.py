"""The built site in a real browser, as a reader opens it: Debian's chromium, headless,
driven over the DevTools protocol by the harness of tests/report/test_browser.py.

Every page loads with no console error and no request leaving 127.0.0.1, every figure
renders (decoded, laid out), every formula is typeset by the bundled MathJax, and the
search box finds "Theorem 1". Screenshots of the front page and of E1's page go to the
test's temp folder, or to $DISTRANK_SCREENSHOTS when set (to look at them).
"""

from __future__ import annotations

import importlib.util
import os
import re
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"

_spec = importlib.util.spec_from_file_location(
    "report_browser", REPO / "tests/report/test_browser.py"
)
report_browser = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report_browser)  # skips this module when chromium is missing
Browser = report_browser.Browser
pytestmark = report_browser.pytestmark  # skipped without chromium, as the report tests

# What the page shows once loaded: figures, and formulas (Sphinx's math spans and
# blocks, each typeset by MathJax into an mjx-container).
PAGE_STATE = """(async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    await MathJax.startup.promise;
  }
  return {
    images: Array.from(document.images).map(i => ({
      src: new URL(i.src).pathname.split('/').pop(), complete: i.complete,
      width: i.naturalWidth, shown: i.getBoundingClientRect().width})),
    math: document.querySelectorAll('.math').length,
    typeset: Array.from(document.querySelectorAll('.math'))
      .filter(m => m.querySelector('mjx-container')).length,
    title: document.querySelector('article h1')?.innerText ?? '',
  };
})()"""


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    profile = tmp_path_factory.mktemp("chromium-profile")
    b = Browser(profile)
    b.send("Log.enable")
    yield b
    b.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    folder = Path(os.environ.get("DISTRANK_SCREENSHOTS") or tmp_path_factory.mktemp("shots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def console_errors(events) -> list[str]:
    errors = []
    for e in events:
        method, params = e.get("method"), e.get("params", {})
        if method == "Runtime.exceptionThrown":
            errors.append(str(params["exceptionDetails"].get("exception", params)))
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            errors.append(
                " ".join(str(a.get("value", a.get("description"))) for a in params["args"])
            )
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            errors.append(f"{params['entry']['text']} {params['entry'].get('url', '')}")
    return errors


@pytest.fixture(scope="module")
def pages(site, browser):
    """Every HTML page of the site opened once: its state in the browser."""
    base, out = site
    states = {}
    for html in sorted(out.rglob("*.html")):
        name = html.relative_to(out).as_posix()
        browser.open(base + name)
        state = browser.eval(PAGE_STATE)
        state["errors"] = console_errors(browser.events)
        state["foreign"] = [u for u in browser.requests() if not u.startswith((base, "data:"))]
        states[name] = state
    return states


def test_every_page_loads_with_no_console_error_and_no_outside_request(pages):
    assert len(pages) > 30
    for name, state in pages.items():
        assert state["errors"] == [], (name, state["errors"])
        assert state["foreign"] == [], (name, state["foreign"])


def test_every_figure_renders_and_every_committed_figure_is_shown(pages):
    # the default study's figures and the Inception study's (docs/figures/inception/), whose
    # names repeat the default's: Sphinx copies a repeated name as <stem>1.png
    committed = sorted(p.name for p in (DOCS / "figures").rglob("*.png"))
    shown = set()
    for name, state in pages.items():
        for image in state["images"]:
            assert image["complete"] and image["width"] > 0, (name, image)  # decoded
            if re.sub(r"1?\.png$", ".png", image["src"]) in committed:  # a figure, no icon
                assert image["width"] > 100 and image["shown"] > 100, (name, image)  # laid out
                shown.add(image["src"])
    assert sorted(re.sub(r"1?\.png$", ".png", src) for src in shown) == committed
    # each experiment page shows its own figures, and only those
    for name, state in pages.items():
        if name.startswith("experiments/") and name != "experiments/index.html":
            key = Path(name).stem
            assert state["images"] and all(i["src"].startswith(f"{key}_") for i in state["images"])
    assert [i["src"] for i in pages["experiments/E4.html"]["images"]] == [
        "E4_diversity_sweep.png",
        "E4_diversity_sweep_terms.png",
        "E4_diversity_sweep_samples.png",
        "E4_large_diversity_sweep.png",  # the large run's, committed beside the page
        "E4_large_diversity_sweep_terms.png",
    ]
    assert [i["src"] for i in pages["index.html"]["images"]] == ["E1_kd_consistency.png"]
    # the Inception study's page shows each of its figures once
    inception = [i["src"] for i in pages["inception.html"]["images"]]
    assert (
        len(inception)
        == len(set(inception))
        == len(list((DOCS / "figures/inception").glob("*.png")))
    )


def test_every_formula_is_typeset_by_the_bundled_mathjax(pages):
    with_math = {name: s for name, s in pages.items() if s["math"]}
    assert {"api/metrics.html", "experiments/E1.html", "experiments/E3.html"} <= set(with_math)
    for name, state in with_math.items():
        assert state["typeset"] == state["math"], (name, state["typeset"], state["math"])


def test_screenshots_of_the_front_page_and_e1(site, browser, shots):
    base, _ = site
    browser.send(
        "Emulation.setDeviceMetricsOverride",
        width=1280,
        height=900,
        deviceScaleFactor=1,
        mobile=False,
    )
    browser.open(base + "index.html")
    browser.eval("localStorage.clear()")  # no search terms highlighted from an earlier visit
    for name, shot in (
        ("index.html", "docs_front_page.png"),
        ("experiments/E1.html", "docs_E1.png"),
    ):
        browser.open(base + name)
        browser.eval(PAGE_STATE)
        time.sleep(0.2)
        assert browser.screenshot(shots / shot).stat().st_size > 10_000


def test_the_search_box_finds_theorem_1(site, browser):
    base, _ = site
    browser.open(base + "index.html")
    browser.eval("document.querySelector('form[role=search] input[name=q]').focus()")
    browser.send("Input.insertText", text="Theorem 1")
    browser.events.clear()
    for kind in ("keyDown", "keyUp"):
        browser.send(
            "Input.dispatchKeyEvent",
            type=kind,
            key="Enter",
            code="Enter",
            windowsVirtualKeyCode=13,
            text="\r" if kind == "keyDown" else "",
        )
    browser.wait(lambda: browser.eval("location.pathname").endswith("/search.html"))
    found = []

    def results():
        found[:] = (
            browser.eval(
                "Array.from(document.querySelectorAll('#search-results ul.search li a'))"
                ".map(a => [new URL(a.href).pathname, a.innerText])"
            )
            or []
        )
        status = browser.eval("document.querySelector('#search-results p')?.innerText ?? ''")
        return found and status.startswith("Search finished")

    browser.wait(results)
    assert browser.eval("new URLSearchParams(location.search).get('q')") == "Theorem 1"
    pages = {path.split("/", 1)[1] for path, _ in found}
    # Theorem 1 is E1's claim, E5's checkpoints, E8's KD rows and the front page's sentence
    assert {"experiments/E1.html", "index.html"} <= pages, found
    assert console_errors(browser.events) == []
