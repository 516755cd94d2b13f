"""Input checks at the boundary (`distrank._arrays`)."""

import numpy as np
import pytest
import torch

from distrank._arrays import _all_finite, as_features, column_mean


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("row", [0, 5, 9])
def test_a_non_finite_entry_in_any_row_block_is_found(row, bad):
    x = np.ones((10, 3), dtype=np.float32)
    assert _all_finite(torch.from_numpy(x), elements=6)  # blocks of 2 rows
    x[row, 2] = bad
    assert not _all_finite(torch.from_numpy(x), elements=6)
    with pytest.raises(ValueError) as err:
        as_features(x, "reference")
    assert str(err.value) == "reference: contains NaN or infinite values"


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_finite_entries_whose_sum_overflows_are_finite_and_opposite_infinities_are_not(dtype):
    big = np.finfo(dtype).max
    x = np.full((4, 3), big, dtype=dtype)  # every block's sum overflows to +inf
    assert np.isfinite(x).all() and _all_finite(torch.from_numpy(x), elements=6)
    x[1] = -big  # a block whose sum is finite
    assert _all_finite(torch.from_numpy(x), elements=6)
    x[3, :2] = [np.inf, -np.inf]  # their sum is NaN
    assert not np.isfinite(x).all() and not _all_finite(torch.from_numpy(x), elements=6)


def test_column_mean_in_row_blocks_is_the_float64_mean():
    x = np.random.default_rng(0).normal(3.0, 2.0, size=(101, 7)).astype(np.float32)
    exact = x.astype(np.float64).mean(axis=0)
    for elements in (7, 70, 10_000):  # 1 row, 10 rows, all rows per block
        got = column_mean(torch.from_numpy(x), elements=elements)
        assert got.dtype == torch.float64
        np.testing.assert_allclose(got.numpy(), exact, rtol=1e-14)
