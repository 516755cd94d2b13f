"""distrank._io: the one file hash, against the published test vectors (FIPS 180-2)."""

import pytest

from distrank._io import file_digest, text_digest

ABC_SHA256 = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
ABC_MD5 = "900150983cd24fb0d6963f7d28e17f72"  # RFC 1321


def test_file_digest_is_the_published_digest(tmp_path):
    (tmp_path / "abc").write_bytes(b"abc")
    assert file_digest(tmp_path / "abc") == ABC_SHA256
    assert file_digest(tmp_path / "abc", "md5") == ABC_MD5


def test_a_file_larger_than_one_read_is_hashed_whole(tmp_path):
    # 1,000,000 x "a": the FIPS 180-2 long-message vector
    (tmp_path / "a").write_bytes(b"a" * 1_000_000)
    assert file_digest(tmp_path / "a") == (
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"
    )


def test_text_digest_hashes_utf8():
    assert text_digest("abc") == ABC_SHA256


def test_a_missing_file_raises(tmp_path):
    with pytest.raises(FileNotFoundError):
        file_digest(tmp_path / "missing")
