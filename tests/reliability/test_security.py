"""Security rows of the reliability matrix (README.md here): the tests' network guard,
https-only downloads, shell directives, and where pickles may be read."""

from __future__ import annotations

import ast
import re
import socket
import string
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from distrank.data.download import fetch
from distrank.data.transfer import DownloadError

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
FAST = {"backoff": 0.0, "timeout": 5, "retries": 0, "sha256": "0" * 64}


# --- no network in the tests but the loopback (tests/conftest.py) ------------------------------


@pytest.mark.parametrize(
    "family,address",
    [
        (socket.AF_INET, ("192.0.2.1", 9)),  # TEST-NET-1: never routed
        (socket.AF_INET, ("example.org", 80)),  # a name: would need DNS first
    ],
)
def test_the_guard_refuses_an_outside_connection_and_fails_the_test(
    blocked_sockets, family, address
):
    with socket.socket(family) as sock, pytest.raises(RuntimeError, match="127.0.0.1 / ::1 only"):
        sock.connect(address)
    assert len(blocked_sockets) == 1 and repr(address) in blocked_sockets[0]
    blocked_sockets.clear()  # recorded: the guard would fail this test at teardown


@pytest.mark.parametrize("call", ["bind-all", "bind-empty", "sendto", "connect_ex"])
def test_the_guard_refuses_listening_everywhere_and_sending_out(blocked_sockets, call):
    kind = socket.SOCK_DGRAM if call == "sendto" else socket.SOCK_STREAM
    with socket.socket(socket.AF_INET, kind) as sock, pytest.raises(RuntimeError):
        {
            "bind-all": lambda: sock.bind(("0.0.0.0", 0)),
            "bind-empty": lambda: sock.bind(("", 0)),
            "sendto": lambda: sock.sendto(b"x", ("198.51.100.7", 53)),
            "connect_ex": lambda: sock.connect_ex(("203.0.113.9", 80)),
        }[call]()
    assert len(blocked_sockets) == 1
    blocked_sockets.clear()


def test_the_guard_lets_the_loopback_through(blocked_sockets):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        for host in ("127.0.0.1", "localhost"):
            with socket.create_connection((host, server.getsockname()[1]), timeout=5):
                pass
    if socket.has_ipv6:
        with socket.socket(socket.AF_INET6) as server:
            try:
                server.bind(("::1", 0))
            except OSError:  # no IPv6 loopback configured: nothing more to check
                pass
    assert blocked_sockets == []


# --- downloads over https only, unless allowed; no scheme-changing redirects -------------------


def test_plain_http_is_refused_before_any_request(http_server, tmp_path):
    url = http_server.put("blob.bin", b"x" * 100)
    with pytest.raises(
        ValueError,
        match=r"refusing to download .*blob\.bin over plain http.*"
        "downloads_allow_http",
    ):
        fetch(url, tmp_path / "blob.bin", **FAST)
    assert http_server.requests == [] and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("url", ["ftp://127.0.0.1/blob.bin", "gopher://127.0.0.1/x"])
def test_other_schemes_are_refused(tmp_path, url):
    with pytest.raises(ValueError, match="is not https or file"):
        fetch(url, tmp_path / "blob.bin", allow_http=True, **FAST)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "target,message",
    [
        (
            "https://127.0.0.1:1/blob.bin",
            r"refusing the redirect of .*/s/blob\.bin to "
            r"https://127\.0\.0\.1:1/blob\.bin: it changes the scheme",
        ),
        (
            "file:///etc/passwd",
            r"Redirection to url 'file:///etc/passwd' is not allowed",
        ),  # urllib's
    ],
)
def test_a_redirect_to_another_scheme_is_refused(http_server, tmp_path, target, message):
    http_server.redirects["/s/blob.bin"] = target
    with pytest.raises(DownloadError, match=message):
        fetch(http_server.url("s/blob.bin"), tmp_path / "blob.bin", allow_http=True, **FAST)
    assert len(http_server.requests) == 1 and list(tmp_path.iterdir()) == []


def test_file_urls_need_no_opt_in(tmp_path):
    import hashlib

    source = tmp_path / "mirror" / "blob.bin"
    source.parent.mkdir()
    source.write_bytes(b"local mirror")
    dest = fetch(
        source.as_uri(),
        tmp_path / "blob.bin",
        sha256=hashlib.sha256(b"local mirror").hexdigest(),
        retries=0,
    )
    assert dest.read_bytes() == b"local mirror"


def test_the_download_rule_refuses_http_unless_the_config_allows_it(http_server, tmp_path):
    url = http_server.put("blob.bin", b"x" * 100)
    config = yaml.safe_load((REPO / "tests/e2e/tiny.yaml").read_text())
    config["downloads"] = {
        "blob": {"url": url, "sha256": None, "md5": None, "size": None, "extract": False}
    }
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(config))
    run = subprocess.run(
        [
            str(SNAKEMAKE),
            "-s",
            str(REPO / "Snakefile"),
            "-d",
            str(tmp_path / "work"),
            "--configfile",
            str(tmp_path / "study.yaml"),
            "--cores",
            "1",
            "resources/downloads/blob",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )
    assert run.returncode != 0
    log = (tmp_path / "work/logs/downloads/blob.log").read_text()
    assert f"refusing to download {url} over plain http" in log
    assert http_server.requests == []
    assert not (tmp_path / "work/resources/downloads/blob").exists()
    assert not (tmp_path / "work/resources/checksums.lock").exists()


# --- no shell: directive interpolates an unquoted value ---------------------------------------

# Placeholders that Snakemake fills with numbers, which need no quoting.
NUMERIC = re.compile(r"threads|resources\.\w+")


def shell_commands(text: str) -> list[tuple[int, str]]:
    """(line, command) of every ``shell:`` directive and ``shell(...)`` call of a Snakefile."""
    lines, found = text.splitlines(), []
    for i, line in enumerate(lines):
        directive = re.match(r"^(\s*)shell:\s*(.*)$", line)
        if directive:
            indent, block = len(directive[1]), [directive[2]]
            for nxt in lines[i + 1 :]:
                if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= indent:
                    break
                block.append(nxt)
            found.append((i + 1, "\n".join(block)))
        for call in re.finditer(r"\bshell\(", line):
            found.append((i + 1, _call_argument(text, sum(map(len, lines[:i])) + i + call.end())))
    return [(line, cmd) for line, cmd in found if cmd.strip()]


def _call_argument(text: str, start: int) -> str:
    depth, end = 1, start
    while depth and end < len(text):
        depth += {"(": 1, ")": -1}.get(text[end], 0)
        end += 1
    return text[start : end - 1]


def unquoted_placeholders(command: str) -> list[str]:
    """Placeholders of a shell command (a Python string expression) without ``:q``."""
    tree = ast.parse(f"({command.strip()})", mode="eval")
    strings = [
        n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    ]
    strings += [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr)]
    bad = []
    for text in strings:
        for _, field, spec, _ in string.Formatter().parse(text):
            if field is not None and spec != "q" and not NUMERIC.fullmatch(field):
                bad.append("{" + field + (":" + spec if spec else "") + "}")
    return bad


def workflow_files() -> list[Path]:
    return [REPO / "Snakefile", *sorted((REPO / "workflow").rglob("*.smk"))]


@pytest.mark.parametrize("path", workflow_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_shell_command_interpolates_an_unquoted_value(path):
    for line, command in shell_commands(path.read_text()):
        assert unquoted_placeholders(command) == [], f"{path}:{line}: quote with :q"


def test_the_shell_check_catches_what_it_should():
    snakefile = '''
rule a:
    params:
        name=config["study"],
    shell:
        "echo {params.name} > {output}"

rule b:
    threads: 2
    shell:
        """
        tool --threads {threads} --mem {resources.mem_mb} {input:q} {output:q}
        """

rule c:
    run:
        shell(f"cp {input:q} {{config[x]}}")
'''
    found = {line: unquoted_placeholders(cmd) for line, cmd in shell_commands(snakefile)}
    assert found == {5: ["{params.name}", "{output}"], 10: [], 17: ["{config[x]}"]}


# --- pickles, weights and archives: the only places they are read -----------------------------


def python_files() -> list[Path]:
    return sorted([*(REPO / "src").rglob("*.py"), *(REPO / "scripts").rglob("*.py")])


def calls(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value.id if isinstance(node.func.value, ast.Name) else None
            yield node, owner, node.func.attr


def keyword(node: ast.Call, name: str):
    value = next((k.value for k in node.keywords if k.arg == name), None)
    return value.value if isinstance(value, ast.Constant) else value


def test_every_torch_load_is_weights_only():
    loads = [
        (p, n)
        for p in python_files()
        for n, owner, attr in calls(p)
        if (owner, attr) == ("torch", "load")
    ]
    assert len(loads) >= 3  # zoo states, EfficientNet-Lite0, feature weights
    for path, node in loads:
        assert keyword(node, "weights_only") is True, f"{path}:{node.lineno}"


def test_pickles_are_read_only_by_the_restricted_unpickler_or_behind_trust_pickles():
    # zoo/checkpoints.py unpickles network pickles, which its callers refuse without
    # trust_pickles (tests/zoo/test_checkpoints.py::test_refuses_untrusted_pickle_before_...).
    allowed = {REPO / "src/distrank/zoo/checkpoints.py"}
    for path in python_files():
        for node, owner, attr in calls(path):
            if owner == "pickle" and attr in ("load", "loads", "Unpickler"):
                assert path in allowed, f"{path}:{node.lineno} reads a pickle"
            if attr == "load" and owner in ("np", "numpy"):
                assert keyword(node, "allow_pickle") in (None, False), f"{path}:{node.lineno}"
            if (owner, attr) == ("yaml", "load"):
                raise AssertionError(f"{path}:{node.lineno}: use yaml.safe_load")
    tree = ast.parse((REPO / "src/distrank/zoo/checkpoints.py").read_text())
    guards = [
        node.test.operand.id
        for node in ast.walk(tree)
        if isinstance(node, ast.If)
        and isinstance(node.test, ast.UnaryOp)
        and isinstance(node.test.op, ast.Not)
        and isinstance(node.test.operand, ast.Name)
    ]
    assert "trust_pickles" in guards  # the code has an `if not trust_pickles:` (no comment)


def test_archives_are_extracted_only_by_safe_extract_with_the_data_filter():
    # tarfile's and zipfile's extractall (the zip one is checked member by member first,
    # tests/data/test_archive.py); `extract` is also the feature extractors' method.
    sites = [(p, n) for p in python_files() for n, _, attr in calls(p) if attr == "extractall"]
    archive = REPO / "src/distrank/data/archive.py"
    assert {p for p, _ in sites} == {archive}, [f"{p}:{n.lineno}" for p, n in sites]
    assert [keyword(n, "filter") for _, n in sites] == ["data"]  # the one tar call
    nodes = list(ast.walk(ast.parse(archive.read_text())))
    # zip: archive.extractall passed on, tar: called; each after _check_all(archive_path, ...)
    assert sum(isinstance(n, ast.Attribute) and n.attr == "extractall" for n in nodes) == 2
    checks = [
        n.args[0].id
        for n in nodes
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "_check_all"
    ]
    assert checks == ["archive_path", "archive_path"]
