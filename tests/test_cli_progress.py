"""Progress bars (distrank._progress): live bars on a terminal, whole lines in logs, quiet."""

import io
import re

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


#: One tqdm line: "desc:  25%|##   | 1/4 [00:00<00:00, 110.42img/s]".
BAR = re.compile(
    r"(?P<desc>.+?): *(?P<pct>\d+)%\|.*\| *(?P<n>\d+)/(?P<total>\d+) "
    r"\[(?P<elapsed>[\d:]+)<(?P<left>[\d:?]+), *(?P<rate>[\d.?]+)(?P<unit>\w+)/s\]"
)


def bar_fields(line: str) -> dict[str, str]:
    """The fields of one progress line (it must be a whole tqdm line)."""
    found = BAR.fullmatch(line.strip())
    assert found, line
    return found.groupdict()


def test_log_lines_are_whole_lines_with_count_rate_and_time_left(monkeypatch):
    monkeypatch.setattr(_progress, "LINE_INTERVAL_S", 0.0)  # a line at every update
    log = io.StringIO()
    with progress(total=4, desc="extract ref", unit="img", file=log) as bar:
        for _ in range(4):
            bar.update(1)
    text = log.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    first, last = bar_fields(lines[0]), bar_fields(lines[-1])
    assert first["desc"] == last["desc"] == "extract ref"
    assert (first["pct"], first["n"], first["total"]) == ("0", "0", "4")
    assert (last["pct"], last["n"], last["total"]) == ("100", "4", "4")
    assert last["unit"] == "img" and last["left"] == "00:00"  # rate, and elapsed<remaining
    assert len(lines) == 5  # the start, then one per update; the end is not repeated


def test_log_lines_are_sparse():
    log = io.StringIO()  # the default interval (30 s) is far longer than this loop
    assert list(progress(range(1000), desc="loop", file=log)) == list(range(1000))
    lines = log.getvalue().splitlines()
    assert len(lines) == 2
    assert [(bar_fields(line)["n"], bar_fields(line)["total"]) for line in lines] == [
        ("0", "1000"),
        ("1000", "1000"),
    ]


def test_terminal_bar_redraws_in_place_with_rate_and_eta():
    tty = Terminal()
    for _ in progress(range(3), desc="train", unit="step", file=tty):
        pass
    text = tty.getvalue()
    assert "\r" in text
    last = bar_fields(text.rstrip().split("\r")[-1])  # the last redraw
    assert (last["n"], last["total"], last["unit"]) == ("3", "3", "step")


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
