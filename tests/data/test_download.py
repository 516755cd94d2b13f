"""fetch(): verification, lock file, resume, retries — against a real local HTTP server."""

import hashlib
import json
import os
import re

import pytest

from distrank.data.checksums import ChecksumError, read_lockfile
from distrank.data.download import fetch
from distrank.data.transfer import DownloadError

PAYLOAD = os.urandom(100_000)
SHA256 = hashlib.sha256(PAYLOAD).hexdigest()
MD5 = hashlib.md5(PAYLOAD).hexdigest()
FAST = {"backoff": 0.0, "timeout": 5, "allow_http": True}  # the local server is plain http


def leftovers(directory):
    return sorted(p.name for p in directory.iterdir())


def test_good_download_is_verified_and_renamed(http_server, tmp_path):
    url = http_server.put("blob.bin", PAYLOAD)
    dest = tmp_path / "sub" / "blob.bin"
    out = fetch(url, dest, sha256=SHA256, md5=MD5, size=len(PAYLOAD), chunk=4096, **FAST)
    assert out == dest and dest.read_bytes() == PAYLOAD
    assert leftovers(dest.parent) == ["blob.bin"]  # no .part left behind
    # A verified existing file is not downloaded again.
    n = len(http_server.requests)
    fetch(url, dest, sha256=SHA256, **FAST)
    assert len(http_server.requests) == n


@pytest.mark.parametrize("kind", ["sha256", "md5", "size"])
def test_mismatch_deletes_file_and_names_everything(http_server, tmp_path, kind):
    url = http_server.put("blob.bin", PAYLOAD)
    dest = tmp_path / "blob.bin"
    wrong = {"sha256": "0" * 64, "md5": "f" * 32, "size": len(PAYLOAD) + 1}[kind]
    actual = {"sha256": SHA256, "md5": MD5, "size": str(len(PAYLOAD))}[kind]
    checks = {"sha256": SHA256, kind: wrong}  # size alone is no checksum, so pair it
    with pytest.raises(ChecksumError) as info:
        fetch(url, dest, **checks, **FAST)
    message = str(info.value)
    said = re.match(
        rf"download of {re.escape(url)} to {re.escape(str(dest))} failed verification: "
        r"(\w+): expected (\S+?)( bytes)?, got (\S+) \(",
        message,
    )
    assert said and said.group(1, 2, 4) == (kind, str(wrong), actual), message
    assert leftovers(tmp_path) == []


def test_corrupt_existing_file_is_downloaded_again(http_server, tmp_path):
    url = http_server.put("blob.bin", PAYLOAD)
    dest = tmp_path / "blob.bin"
    dest.write_bytes(b"stale")
    fetch(url, dest, sha256=SHA256, **FAST)
    assert dest.read_bytes() == PAYLOAD


def test_no_checksum_and_no_lockfile_is_refused(http_server, tmp_path):
    url = http_server.put("blob.bin", PAYLOAD)
    with pytest.raises(ValueError, match="without verification"):
        fetch(url, tmp_path / "blob.bin", **FAST)
    assert http_server.requests == [] and leftovers(tmp_path) == []


def test_lockfile_records_then_verifies_then_detects_change(http_server, tmp_path):
    lock = tmp_path / "resources" / "checksums.lock"
    url_b = http_server.put("b.bin", PAYLOAD)
    url_a = http_server.put("a.bin", b"another file")
    dest = tmp_path / "b.bin"

    fetch(url_b, dest, lockfile=lock, **FAST)
    fetch(url_a, tmp_path / "a.bin", lockfile=lock, **FAST)
    entries = json.loads(lock.read_text())
    assert list(entries) == sorted(entries) == [url_a, url_b]
    assert entries[url_b] == {"sha256": SHA256, "size": len(PAYLOAD)}
    assert read_lockfile(lock) == entries
    assert not [p for p in lock.parent.iterdir() if p.name.endswith(".tmp")]

    # Verified against the record: an intact file is kept, a fresh download passes.
    dest.unlink()
    fetch(url_b, dest, lockfile=lock, **FAST)
    assert dest.read_bytes() == PAYLOAD

    # Upstream changes the file: the record catches it, the bad file is removed.
    http_server.put("b.bin", PAYLOAD[::-1])
    dest.unlink()
    with pytest.raises(ChecksumError) as info:
        fetch(url_b, dest, lockfile=lock, **FAST)
    assert str(lock) in str(info.value) and SHA256 in str(info.value)
    assert not dest.exists() and not dest.with_name("b.bin.part").exists()
    assert json.loads(lock.read_text()) == entries  # the record is never overwritten


def test_existing_file_tampered_after_recording_is_replaced(http_server, tmp_path):
    lock = tmp_path / "checksums.lock"
    url = http_server.put("b.bin", PAYLOAD)
    dest = tmp_path / "b.bin"
    fetch(url, dest, lockfile=lock, **FAST)
    dest.write_bytes(b"tampered")
    fetch(url, dest, lockfile=lock, **FAST)
    assert dest.read_bytes() == PAYLOAD


def test_resume_from_part_with_range_request(http_server, tmp_path):
    url = http_server.put("blob.bin", PAYLOAD)
    dest = tmp_path / "blob.bin"
    dest.with_name("blob.bin.part").write_bytes(PAYLOAD[:30_000])
    fetch(url, dest, sha256=SHA256, **FAST)
    assert dest.read_bytes() == PAYLOAD
    assert http_server.requests[-1]["range"] == "bytes=30000-"


def test_server_without_range_support_restarts(http_server, tmp_path):
    http_server.accept_ranges = False
    url = http_server.put("blob.bin", PAYLOAD)
    dest = tmp_path / "blob.bin"
    dest.with_name("blob.bin.part").write_bytes(b"x" * 30_000)  # wrong bytes: must not be kept
    fetch(url, dest, sha256=SHA256, **FAST)
    assert dest.read_bytes() == PAYLOAD


def test_resume_onto_corrupt_part_fails_verification(http_server, tmp_path):
    url = http_server.put("blob.bin", PAYLOAD)
    dest = tmp_path / "blob.bin"
    dest.with_name("blob.bin.part").write_bytes(b"x" * 30_000)
    with pytest.raises(ChecksumError):
        fetch(url, dest, sha256=SHA256, **FAST)
    assert leftovers(tmp_path) == []


def test_retries_after_transient_errors(http_server, tmp_path):
    url = http_server.put("blob.bin", PAYLOAD)
    http_server.fail_next(2, status=500)
    fetch(url, tmp_path / "blob.bin", sha256=SHA256, retries=3, **FAST)
    assert len(http_server.requests) == 3


def test_gives_up_after_retries(http_server, tmp_path):
    url = http_server.put("blob.bin", PAYLOAD)
    http_server.fail_next(10, status=503)
    with pytest.raises(DownloadError, match=r"blob\.bin after 3 attempts; last error: HTTP 503 "):
        fetch(url, tmp_path / "blob.bin", sha256=SHA256, retries=2, **FAST)
    assert len(http_server.requests) == 3
    assert not (tmp_path / "blob.bin").exists()


def test_not_found_is_not_retried(http_server, tmp_path):
    with pytest.raises(DownloadError, match=r"missing\.bin: HTTP 404 Not Found$"):
        fetch(http_server.url("missing.bin"), tmp_path / "m.bin", sha256=SHA256, **FAST)
    assert len(http_server.requests) == 1


def test_truncated_response_is_resumed(http_server, tmp_path):
    url = http_server.put("blob.bin", PAYLOAD)
    http_server.truncate_next(1, keep=40_000)
    dest = tmp_path / "blob.bin"
    fetch(url, dest, sha256=SHA256, size=len(PAYLOAD), chunk=8192, **FAST)
    assert dest.read_bytes() == PAYLOAD
    assert [r["range"] for r in http_server.requests] == [None, "bytes=40000-"]


def test_redirect_and_query_string(http_server, tmp_path):
    http_server.put("files/blob.bin", PAYLOAD)
    http_server.redirects["/s/blob.bin"] = "/files/blob.bin"
    dest = fetch(http_server.url("s/blob.bin?dl=1"), tmp_path / "blob.bin", md5=MD5, **FAST)
    assert dest.read_bytes() == PAYLOAD
    assert http_server.requests[0]["query"] == "dl=1"


# --- GitHub code archives: identified by commit and tree, bytes second ------------------------

COMMIT = "6f160b3d22b8b178ebe533a50d4d5e63aedba21d"


def _code_archive(files: dict, *, commit=COMMIT, compresslevel=9, mtime=0) -> bytes:
    """A .tar.gz laid out as `git archive` (GitHub) writes one: a pax global header with
    the commit, then <repo>-<commit>/... members."""
    import gzip
    import io
    import tarfile

    raw = io.BytesIO()
    headers = {"comment": commit} if commit else {}
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT, pax_headers=headers) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"repo-{COMMIT}/{name}")
            if isinstance(data, tuple):  # (symlink target,)
                info.type, info.linkname = tarfile.SYMTYPE, data[0]
            else:
                info.size, info.mode = len(data), 0o775 if name.endswith(".sh") else 0o664
            tar.addfile(info, io.BytesIO(data) if not isinstance(data, tuple) else None)
    return gzip.compress(raw.getvalue(), compresslevel=compresslevel, mtime=mtime)


FILES = {"README.md": b"hello\n", "a/b.py": b"x = 1\n", "a/run.sh": b"#!/bin/sh\n", "ln": ("a",)}


def _git_tree_id(files: dict, tmp_path) -> str:
    """Independent: the tree id git itself computes for these files."""
    import shutil
    import subprocess

    if shutil.which("git") is None:
        pytest.skip("needs git")
    repo = tmp_path / "gitrepo"
    repo.mkdir()
    for name, data in files.items():
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, tuple):
            path.symlink_to(data[0])
        else:
            path.write_bytes(data)
            if name.endswith(".sh"):
                path.chmod(0o755)
    env = {"GIT_DIR": str(repo / ".git"), "GIT_WORK_TREE": str(repo), "PATH": os.environ["PATH"]}
    subprocess.run(["git", "init", "-q"], env=env, check=True)
    subprocess.run(["git", "add", "-A"], env=env, check=True)
    return subprocess.run(
        ["git", "write-tree"], env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


def test_archive_identity_is_the_commit_and_git_tree(tmp_path):
    from distrank.data.checksums import archive_identity, code_archive_commit

    path = tmp_path / "code.tar.gz"
    path.write_bytes(_code_archive(FILES))
    identity = archive_identity(path)
    assert identity.commit == COMMIT
    assert identity.tree == _git_tree_id(FILES, tmp_path)
    assert code_archive_commit(f"https://github.com/NVlabs/x/archive/{COMMIT}.tar.gz") == COMMIT
    assert code_archive_commit(f"http://127.0.0.1:9/NVlabs/x/archive/{COMMIT}.tar.gz") == COMMIT
    assert code_archive_commit("https://github.com/NVlabs/x/archive/main.tar.gz") is None


def test_recompressed_code_archive_is_accepted_by_tree(http_server, tmp_path, caplog):
    """GitHub once changed its archives' compression: same commit, same files, new bytes."""
    url = http_server.put(f"NVlabs/repo/archive/{COMMIT}.tar.gz", _code_archive(FILES))
    lock, dest = tmp_path / "checksums.lock", tmp_path / "code"
    fetch(url, dest, lockfile=lock, **FAST)
    first = read_lockfile(lock)[url]
    assert first["commit"] == COMMIT and first["tree"] == _git_tree_id(FILES, tmp_path)
    assert first["sha256"] == hashlib.sha256(dest.read_bytes()).hexdigest()

    dest.unlink()
    recompressed = _code_archive(FILES, compresslevel=1, mtime=12345)
    http_server.put(f"NVlabs/repo/archive/{COMMIT}.tar.gz", recompressed)
    with caplog.at_level("WARNING"):
        fetch(url, dest, lockfile=lock, **FAST)
    assert dest.read_bytes() == recompressed
    again = read_lockfile(lock)[url]
    assert again["tree"] == first["tree"] and again["sha256"] != first["sha256"]
    assert "archive's bytes changed" in caplog.text


def test_code_archive_with_other_files_or_commit_is_refused(http_server, tmp_path):
    name = f"NVlabs/repo/archive/{COMMIT}.tar.gz"
    url = http_server.put(name, _code_archive(FILES))
    lock, dest = tmp_path / "checksums.lock", tmp_path / "code"
    fetch(url, dest, lockfile=lock, **FAST)
    tree = read_lockfile(lock)[url]["tree"]
    dest.unlink()
    http_server.put(name, _code_archive({**FILES, "a/b.py": b"x = 2\n"}))
    with pytest.raises(ChecksumError, match=f"tree: expected {tree}"):
        fetch(url, dest, lockfile=lock, **FAST)
    assert not dest.exists() and read_lockfile(lock)[url]["tree"] == tree

    other = tmp_path / "other"
    url2 = http_server.put(
        f"NVlabs/other/archive/{COMMIT}.tar.gz", _code_archive(FILES, commit="a" * 40)
    )
    with pytest.raises(ChecksumError, match=f"names commit {'a' * 40}, not the URL's {COMMIT}"):
        fetch(url2, other, lockfile=lock, **FAST)
    assert not other.exists() and url2 not in read_lockfile(lock)


def test_code_archive_recorded_by_bytes_only_gains_its_tree(http_server, tmp_path):
    data = _code_archive(FILES)
    url = http_server.put(f"NVlabs/repo/archive/{COMMIT}.tar.gz", data)
    lock = tmp_path / "checksums.lock"
    entry = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    lock.write_text(json.dumps({url: entry}))
    fetch(url, tmp_path / "code", lockfile=lock, **FAST)
    assert read_lockfile(lock)[url] == {
        **entry,
        "commit": COMMIT,
        "tree": _git_tree_id(FILES, tmp_path),
    }
