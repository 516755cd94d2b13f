"""distrank._io: the one file hash, against the published test vectors (FIPS 180-2); a
job's cost, against the kernel's own accounting."""

import os
import subprocess
import sys
import time

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


JOB = """
import sys, time
import numpy as np
from distrank._io import logged
with logged(sys.argv[1], cost=sys.argv[2]):
    block = np.ones(300 * 2**20 // 8)  # 300 MB, touched
    t = time.process_time()
    while time.process_time() - t < 0.5:  # half a second of CPU
        pass
    if len(sys.argv) > 3:
        raise SystemExit(sys.argv[3])
"""


@pytest.mark.skipif(not hasattr(os, "wait4"), reason="wait4: the kernel's accounting")
def test_a_jobs_cost_is_the_kernels_own_accounting_of_it(tmp_path):
    """A job's cost file (``logged(..., cost=)``) holds what the kernel reports for the
    finished process from outside (``os.wait4``): its CPU seconds (all but the
    interpreter's shutdown, after the file is written) and its peak memory; a job that
    fails leaves none, and a stale one from an earlier run goes."""
    from distrank.experiments.cost import read_benchmark

    log, cost = tmp_path / "job.log", tmp_path / "job.tsv"
    started = time.time()
    child = subprocess.Popen([sys.executable, "-c", JOB, str(log), str(cost)])
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.time() - started
    assert os.waitstatus_to_exitcode(status) == 0
    got = read_benchmark(cost)
    assert got.cpu == pytest.approx(usage.ru_utime + usage.ru_stime, abs=0.1)
    assert got.max_rss == pytest.approx(usage.ru_maxrss / 1024, abs=1.0)
    assert got.max_rss > 300 and got.cpu >= 0.5 and 0.5 <= got.wall <= wall
    failed = subprocess.run([sys.executable, "-c", JOB, str(log), str(cost), "failed"])
    assert failed.returncode == 1 and not cost.exists() and "failed" in log.read_text()
