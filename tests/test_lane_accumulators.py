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


def test_lanes_live_across_the_whole_nest_of_reduce_loops():
    """A weight gradient sums over 32 x 26 x 26, lanes along the last 26: the lane arrays are
    declared before the nest's outer loop and combined once after it, not once per row of 26
    (which re-started 16 lanes and combined them 832 times per output). Same numbers."""
    from tinyteach.codegen.lower import lower
    from tinyteach.engine.schedule import create_schedule
    from tinyteach.opt.heuristic import heuristic_plan
    from tinyteach.render.c import CRenderer, with_lanes
    rng = np.random.default_rng(5)
    x = rng.normal(size=(32, 26, 26)).astype(np.float32)
    y = rng.normal(size=(8, 32, 26, 26)).astype(np.float32)
    total = (Tensor(x, device="CPU").reshape(1, 32, 26, 26) * Tensor(y, device="CPU")
             ).sum(axis=(1, 2, 3))
    (item,) = [i for i in create_schedule([total.uop], "CPU")[0] if i.kind == "kernel"]
    program = lower(item.ast, heuristic_plan(item.ast, 16))
    if not with_lanes(program, 16).lane_loops:
        pytest.skip("the heuristic split no loop into lanes here")
    lines = CRenderer(16).render("k", program).splitlines()
    declared = next(i for i, line in enumerate(lines) if "_lanes[16] = {" in line)
    outer = next(i for i, line in enumerate(lines) if "for (int ridx0 = 0;" in line)
    combined = next(i for i, line in enumerate(lines) if "_half = 8;" in line)
    closes = [i for i, line in enumerate(lines) if line.strip() == "}" and outer < i < combined]
    assert declared < outer < combined and len(closes) >= 2  # combined after ridx0 and ridx1
    np.testing.assert_allclose(total.numpy(), (x * y).sum(axis=(1, 2, 3), dtype=np.float64),
                               rtol=1e-4, atol=1e-3)
