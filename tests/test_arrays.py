"""Input checks at the boundary (`distrank._arrays`)."""

import numpy as np
import pytest
import torch

from distrank._arrays import _all_finite, as_features


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
