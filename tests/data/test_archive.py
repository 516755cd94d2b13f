"""safe_extract(): good archives extract; escaping members are refused before any write."""

import io
import tarfile
import zipfile

import pytest

from distrank.data.archive import UnsafeArchiveError, safe_extract


def make_tar(path, members, mode="w"):
    """members: (name, kind, payload) with kind in file|dir|symlink|hardlink|fifo."""
    with tarfile.open(path, mode) as tar:
        for name, kind, payload in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
                continue
            info.type = {
                "dir": tarfile.DIRTYPE,
                "symlink": tarfile.SYMTYPE,
                "hardlink": tarfile.LNKTYPE,
                "fifo": tarfile.FIFOTYPE,
            }[kind]
            if kind in ("symlink", "hardlink"):
                info.linkname = payload
            tar.addfile(info)
    return path


def make_zip(path, members):
    with zipfile.ZipFile(path, "w") as archive:
        for name, payload in members:
            # ZipInfo keeps the name as given (ZipFile.write would sanitise it).
            archive.writestr(zipfile.ZipInfo(name), payload)
    return path


GOOD = [
    ("top", "dir", None),
    ("top/a.txt", "file", b"alpha"),
    ("top/sub/b.txt", "file", b"beta"),
    ("top/link", "symlink", "sub/b.txt"),
]


@pytest.mark.parametrize("mode,suffix", [("w", ".tar"), ("w:gz", ".tar.gz"), ("w:bz2", ".tbz")])
def test_tar_extracts(tmp_path, mode, suffix):
    archive = make_tar(tmp_path / f"good{suffix}", GOOD, mode)
    dest = safe_extract(archive, tmp_path / "out")
    assert (dest / "top/a.txt").read_bytes() == b"alpha"
    assert (dest / "top/link").is_symlink() and (dest / "top/link").read_bytes() == b"beta"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good" + suffix, "out"]  # no temp dir


def test_zip_extracts_whatever_its_name(tmp_path):
    archive = make_zip(tmp_path / "afhq.zip?dl=1", [("afhq/train/cat/x.jpg", b"jpg")])
    dest = safe_extract(archive, tmp_path / "out")
    assert (dest / "afhq/train/cat/x.jpg").read_bytes() == b"jpg"


TAR_ATTACKS = {
    "dotdot": [("ok.txt", "file", b"ok"), ("../evil.txt", "file", b"evil")],
    "nested dotdot": [("a/../../evil.txt", "file", b"evil")],
    "absolute": [("/tmp/evil.txt", "file", b"evil")],
    "symlink out": [("escape", "symlink", "../../.."), ("ok.txt", "file", b"ok")],
    "symlink absolute": [("escape", "symlink", "/etc")],
    "write through symlink": [("inside", "symlink", "sub"), ("inside/evil.txt", "file", b"x")],
    "hardlink out": [("hard", "hardlink", "../../etc/passwd")],
    "hardlink absolute": [("hard", "hardlink", "/etc/passwd")],
    "fifo": [("pipe", "fifo", None)],
}


@pytest.mark.parametrize("attack", sorted(TAR_ATTACKS))
def test_tar_attacks_are_refused_and_nothing_is_written(tmp_path, attack):
    work = tmp_path / "work"
    work.mkdir()
    archive = make_tar(tmp_path / "bad.tar.gz", TAR_ATTACKS[attack], "w:gz")
    with pytest.raises(UnsafeArchiveError, match="refusing to extract .*bad.tar.gz"):
        safe_extract(archive, work / "out")
    assert list(work.iterdir()) == []  # no dest, no temp dir, no partial file
    assert not (tmp_path / "evil.txt").exists()


@pytest.mark.parametrize(
    "name", ["../evil.txt", "/evil.txt", "a/../../evil.txt", "..\\evil.txt", "C:/evil.txt"]
)
def test_zip_attacks_are_refused(tmp_path, name):
    work = tmp_path / "work"
    work.mkdir()
    archive = make_zip(tmp_path / "bad.zip", [("ok.txt", b"ok"), (name, b"evil")])
    with pytest.raises(
        UnsafeArchiveError,
        match=r"^refusing to extract .*bad\.zip, nothing was extracted: '.*evil\.txt': ",
    ):
        safe_extract(archive, work / "out")
    assert list(work.iterdir()) == []


def test_error_lists_the_offending_member(tmp_path):
    archive = make_tar(tmp_path / "bad.tar", TAR_ATTACKS["dotdot"])
    with pytest.raises(UnsafeArchiveError, match=r"'\.\./evil\.txt': path contains '\.\.'"):
        safe_extract(archive, tmp_path / "out")


def test_existing_nonempty_dest_is_refused(tmp_path):
    archive = make_tar(tmp_path / "good.tar", GOOD)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep").write_text("x")
    with pytest.raises(FileExistsError):
        safe_extract(archive, tmp_path / "out")
    (tmp_path / "out" / "keep").unlink()  # an empty directory is fine
    assert (safe_extract(archive, tmp_path / "out") / "top/a.txt").exists()


def test_not_an_archive(tmp_path):
    (tmp_path / "junk.tar.gz").write_bytes(b"not an archive at all")
    with pytest.raises(ValueError, match="neither a zip nor a tar"):
        safe_extract(tmp_path / "junk.tar.gz", tmp_path / "out")
