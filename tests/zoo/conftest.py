import numpy as np
import pytest


@pytest.fixture(scope="session")
def toy():
    """A tiny class-conditional image set: class c is a bright band at rows 2c..2c+7."""
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(10), 16)
    images = rng.integers(0, 40, size=(len(labels), 28, 28)).astype(np.uint8)
    for i, c in enumerate(labels):
        images[i, 2 * c : 2 * c + 8] += 200
    return images, labels
