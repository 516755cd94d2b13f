"""Progress bars (distrank._progress): live bars on a terminal, whole lines in logs, quiet."""

import io

import pytest

from distrank import _progress
from distrank._progress import is_quiet, progress, set_quiet


class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture(autouse=True)
def _follow_env(monkeypatch):
    monkeypatch.delenv("DISTRANK_QUIET", raising=False)
    set_quiet(None)
    yield
    set_quiet(None)


def test_log_lines_are_whole_lines_with_count_rate_and_time_left(monkeypatch):
    monkeypatch.setattr(_progress, "LINE_INTERVAL_S", 0.0)  # a line at every update
    log = io.StringIO()
    with progress(total=4, desc="extract ref", unit="img", file=log) as bar:
        for _ in range(4):
            bar.update(1)
    text = log.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert lines[0].startswith("extract ref:   0%") and "0/4" in lines[0]
    assert lines[-1].startswith("extract ref: 100%") and "4/4" in lines[-1]
    assert "img/s" in lines[-1] and "<" in lines[-1]  # rate, and elapsed<remaining
    assert len(lines) == 5  # the start, then one per update; the end is not repeated


def test_log_lines_are_sparse():
    log = io.StringIO()  # the default interval (30 s) is far longer than this loop
    assert list(progress(range(1000), desc="loop", file=log)) == list(range(1000))
    lines = log.getvalue().splitlines()
    assert len(lines) == 2 and "0/1000" in lines[0] and "1000/1000" in lines[1]


def test_terminal_bar_redraws_in_place_with_rate_and_eta():
    tty = Terminal()
    for _ in progress(range(3), desc="train", unit="step", file=tty):
        pass
    text = tty.getvalue()
    assert "\r" in text and "3/3" in text and "step/s" in text


@pytest.mark.parametrize("how", ["set_quiet", "env"])
def test_quiet_prints_nothing_and_still_iterates(monkeypatch, how):
    if how == "env":
        monkeypatch.setenv("DISTRANK_QUIET", "1")
    else:
        set_quiet(True)
    assert is_quiet()
    log = io.StringIO()
    assert list(progress(range(5), desc="quiet", file=log)) == list(range(5))
    with progress(total=2, file=log) as bar:
        bar.update(2)
    assert log.getvalue() == ""
    previous = set_quiet(False)  # an explicit choice wins over the environment
    assert not is_quiet()
    set_quiet(None)
    assert is_quiet() == (how == "env")
    assert previous is (True if how == "set_quiet" else None)
