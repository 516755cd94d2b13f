"""What a reader sees, parsed: the visible text of an HTML page, the message of a CLI
error and the cells of a Markdown table. Tests assert on these, never on a substring of
a whole page, file or log, where encoded images, attributes or paths could match by
accident."""

from __future__ import annotations

import re
from html.parser import HTMLParser

#: Elements whose content a browser does not show as text.
_HIDDEN = {"script", "style", "head", "title", "template", "noscript"}
#: Elements that end a line of text (so words of adjacent blocks never run together).
_BLOCKS = {
    "p", "div", "li", "ul", "ol", "tr", "table", "thead", "tbody", "br", "h1", "h2", "h3",
    "h4", "h5", "h6", "section", "figure", "figcaption", "caption", "pre", "dl", "dt", "dd",
}  # fmt: skip


class _Text(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.hidden = 0

    def handle_starttag(self, tag, attrs):
        if tag in _HIDDEN:
            self.hidden += 1
        elif tag in _BLOCKS:
            self.parts.append("\n")
        elif tag in ("td", "th"):
            self.parts.append("\t")

    def handle_endtag(self, tag):
        if tag in _HIDDEN:
            self.hidden = max(0, self.hidden - 1)
        elif tag in _BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data):
        if not self.hidden:
            self.parts.append(data)


def visible_lines(page: str) -> list[str]:
    """The page's visible text (no tags, attributes, scripts, styles or data URIs), one
    entry per line of text, whitespace collapsed, empty lines dropped."""
    parser = _Text()
    parser.feed(page)
    parser.close()
    lines = "".join(parser.parts).split("\n")
    return [" ".join(line.split()) for line in lines if line.strip()]


def visible_text(page: str) -> str:
    """The visible lines of a page joined by newlines."""
    return "\n".join(visible_lines(page))


class _Tables(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tables: list[list[list[str]]] = []
        self.cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self.tables[-1].append([])
        elif tag in ("td", "th") and self.tables and self.tables[-1]:
            self.cell = []
        elif tag == "br" and self.cell is not None:
            self.cell.append("\n")

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            lines = "".join(self.cell).split("\n")
            self.tables[-1][-1].append("\n".join(" ".join(line.split()) for line in lines))
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell.append(data)


def html_tables(page: str) -> list[list[list[str]]]:
    """The tables of an HTML page, each a list of rows, each the visible text of its cells
    (``th`` and ``td``; whitespace collapsed, a ``<br>`` kept as a newline), so a test
    compares whole cells, never a number inside a longer one."""
    parser = _Tables()
    parser.feed(page)
    parser.close()
    return parser.tables


def significant(text: str) -> tuple[float, int]:
    """A number as a page shows it (``0.06961``, ``13.55``, ``1.000e-09``): its value and
    how many significant digits it shows (trailing zeros count, leading ones do not; all
    digits of a zero)."""
    digits = re.sub(r"\D", "", text.lower().split("e")[0])
    return float(text), len(digits.lstrip("0")) or len(digits)


def shows_rounded(text: str, value: float, digits: int = 4) -> bool:
    """Whether ``text`` shows ``value`` rounded to ``digits`` significant digits."""
    number, shown = significant(text)
    return shown == digits and f"{number:.{digits - 1}e}" == f"{value:.{digits - 1}e}"


def words(text: str) -> list[str]:
    """The words of a text (letters, digits, ``_``, ``-`` and ``.`` inside a word)."""
    return re.findall(r"[\w][\w.\-]*[\w]|[\w]", text)


def cli_error(stderr: str, command: str | None = None) -> str:
    """The message of the CLI's one error line, ``distrank <command>: error: <message>``.

    Fails unless exactly one such line is present, so a test reads the message the user
    was shown, not a match anywhere in the log.
    """
    name = re.escape(command) if command else r"\S+"
    found = re.findall(rf"^distrank {name}: error: (.*)$", stderr, flags=re.M)
    assert len(found) == 1, f"expected one error line in:\n{stderr}"
    return found[0]


def markdown_tables(text: str) -> list[list[dict[str, str]]]:
    """The pipe tables of a Markdown text, each a list of rows ``{header: cell}`` (cells
    stripped), so a test compares whole cells, never a number inside a longer one."""
    tables, block = [], []
    for line in [*text.splitlines(), ""]:
        line = line.strip()
        if line.startswith("|") and line.endswith("|"):
            block.append([cell.strip() for cell in line[1:-1].split("|")])
            continue
        if block:
            header, rule, *rows = block
            assert all(re.fullmatch(r":?-+:?", cell) for cell in rule), f"not a table: {block}"
            tables.append([dict(zip(header, row, strict=True)) for row in rows])
            block = []
    return tables
