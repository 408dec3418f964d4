"""A reduction over several axes whose inner loop is split into explicit lanes (render/c.py,
FIXED_LANES): the accumulator carries the outer loop's partial result into lane 0, and the other
lanes start at the identity. Copying the accumulator into every lane counted each outer row's
partial sum W times (a sum of a 6x3000 matrix came out as -2.9e6 instead of 105)."""
import numpy as np
import pytest

from tinyteach import Tensor

SHAPES = [(6, 3000), (5, 7, 1001), (3, 17), (4, 4096), (2, 9, 31)]


@pytest.mark.parametrize("shape", SHAPES)
def test_sum_max_min_over_all_axes_match_numpy(shape):
    x = np.random.default_rng(len(shape)).normal(size=shape).astype(np.float32)
    t = Tensor(x, device="CPU")
    np.testing.assert_allclose(t.sum().numpy(), x.sum(dtype=np.float64), rtol=1e-4, atol=1e-3)
    assert t.max().numpy() == x.max()
    assert t.min().numpy() == x.min()
    np.testing.assert_allclose(t.sum(axis=(0, -1)).numpy(), x.sum(axis=(0, -1), dtype=np.float64),
                               rtol=1e-4, atol=1e-3)


def test_a_nan_in_any_row_reaches_the_max_over_all_axes():
    x = np.random.default_rng(3).normal(size=(6, 3000)).astype(np.float32)
    x[4, 2999] = np.nan
    assert np.isnan(Tensor(x, device="CPU").max().numpy())
