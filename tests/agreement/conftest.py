"""One BLAS thread for the agreement tests: their matrices are small and the
machine is shared, so more threads only contend."""

import pytest
from threadpoolctl import threadpool_limits


@pytest.fixture(autouse=True, scope="session")
def _one_blas_thread():
    with threadpool_limits(limits=1, user_api="blas"):
        yield
