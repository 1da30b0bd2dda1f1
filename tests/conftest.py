import numpy as np
import pytest

import opforge as of


@pytest.fixture
def scratch_ops():
    """Names of ops a test defines; they are removed from the registry (and opforge.ops) afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        if name in of.registry:
            of.registry.remove(name)


@pytest.fixture
def rng():
    return np.random.default_rng(0)
