"""FD to the last bit: every solve on one thread, the same bytes in every process and for
every thread count, and the right values (closed forms, numpy's SVD)."""

import subprocess
import sys
import threading

import numpy as np
import pytest
import torch
from threadpoolctl import threadpool_info

from distrank.metrics.fd._frechet import one_thread_each

D = 1280  # where MKL's threaded eigvalsh varied in its last bits from process to process

# Run in each subprocess: FD's terms of two references (a full-rank covariance, factored by
# Cholesky, and 600 rows, kept as their factor) against two models (a covariance with the
# same eigenvectors, and 900 rows, made triangular by a QR), with torch held to argv[1]
# threads; the terms' bytes.
SCRIPT = """
import sys
import numpy as np
import torch
from distrank.metrics.fd._frechet import GaussianStats, factored, frechet_terms, gaussian_stats

torch.set_num_threads(int(sys.argv[1]))
rng = np.random.default_rng(39)
d = int(sys.argv[2])
q, _ = np.linalg.qr(rng.normal(size=(d, d)))
a, b = rng.uniform(0.1, 3.0, d), rng.uniform(0.1, 3.0, d)
stats_a = GaussianStats(10 * d, rng.normal(size=d), (q * a) @ q.T)
stats_b = GaussianStats(10 * d, rng.normal(size=d), (q * b) @ q.T)
x, y = rng.normal(size=(600, d)), rng.normal(0.2, 1.3, size=(900, d))
t = frechet_terms([stats_a, gaussian_stats(x)], factored([stats_b, gaussian_stats(y)]))
sys.stdout.write(np.stack([t.mean, t.trace_reference, t.trace_model, t.root]).tobytes().hex())
"""


def test_fd_is_the_same_to_the_last_bit_in_three_processes_and_thread_counts():
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", SCRIPT, str(threads), str(D)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for threads in (1, 2, 2)
    ]
    out = [run.communicate(timeout=600)[0] for run in runs]
    assert all(run.returncode == 0 for run in runs)
    assert out[0] and out[1] == out[0] and out[2] == out[0]  # 1 thread, 2 threads, twice

    mean, trace_ref, trace_model, root = np.frombuffer(bytes.fromhex(out[0])).reshape(4, 2, 2)
    rng = np.random.default_rng(39)  # the script's draws, in its order
    q, _ = np.linalg.qr(rng.normal(size=(D, D)))
    a, b = rng.uniform(0.1, 3.0, D), rng.uniform(0.1, 3.0, D)
    m_a, m_b = rng.normal(size=D), rng.normal(size=D)
    x, y = rng.normal(size=(600, D)), rng.normal(0.2, 1.3, size=(900, D))
    # commuting covariances: FD = |m_a - m_b|^2 + sum (sqrt a - sqrt b)^2
    fd = mean + trace_ref + trace_model - 2 * root
    expected = np.sum((m_a - m_b) ** 2) + np.sum((np.sqrt(a) - np.sqrt(b)) ** 2)
    assert fd[0, 0] == pytest.approx(expected, rel=1e-10)
    # rows on both sides: the root term is the nuclear norm of A B^T (centred, scaled rows)
    xc = (x - x.mean(axis=0)) / np.sqrt(len(x) - 1)
    yc = (y - y.mean(axis=0)) / np.sqrt(len(y) - 1)
    nuclear = np.linalg.svd(xc @ yc.T, compute_uv=False).sum()
    assert root[1, 1] == pytest.approx(nuclear, rel=1e-10)


def test_one_thread_each_holds_every_library_to_one_thread_and_restores_them():
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        barrier = threading.Barrier(2, timeout=30)  # broken unless two workers run at once

        def task(i):
            barrier.wait()
            return i, torch.get_num_threads()

        with one_thread_each() as map_:
            assert torch.get_num_threads() == 1
            assert {lib["num_threads"] for lib in threadpool_info()} == {1}
            assert map_(task, range(4)) == [(i, 1) for i in range(4)]  # in order, one thread
            with one_thread_each() as inner:  # nested: one worker
                assert len(set(inner(lambda i: threading.get_ident(), range(3)))) == 1
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(previous)
