"""The plan cache (engine/realize.py, eager dispatch): a fresh graph of the same structure reuses
the plan; graphs differing in a constant, a shape or a dtype do not share one; PLAN_CACHE=0 and
clear_caches() work. Values are checked against numpy."""
from __future__ import annotations

import numpy as np

from tinyteach import Context, Tensor
from tinyteach.engine.realize import plan_cache, plan_key
from tinyteach.helpers import clear_caches


def _key(t: Tensor) -> object:
    return plan_key([t.uop], "NUMPY")[0]


def test_same_structure_shares_a_plan_and_gives_each_its_own_values() -> None:
    a, b = Tensor([1.0, 2.0, 3.0], device="NUMPY").realize(), \
        Tensor([4.0, 5.0, 6.0], device="NUMPY").realize()
    assert _key(a + 1) == _key(b + 1)
    np.testing.assert_allclose((a + 1).numpy(), np.array([1, 2, 3]) + 1)
    np.testing.assert_allclose((b + 1).numpy(), np.array([4, 5, 6]) + 1)


def test_a_constant_a_shape_or_a_dtype_changes_the_plan() -> None:
    x = Tensor([1.0, 2.0], device="NUMPY").realize()
    assert _key(x * 0.0) != _key(x * -0.0)
    assert _key(x + 1) != _key(x + 2)
    y = Tensor([1.0, 2.0, 3.0], device="NUMPY").realize()
    assert _key(x + 1) != _key(y + 1)
    z = Tensor(np.array([1, 2], dtype=np.int32), device="NUMPY").realize()
    assert _key(x + 1) != _key(z + 1)
    np.testing.assert_array_equal((x * -0.0).numpy(), np.array([1.0, 2.0]) * -0.0)
    np.testing.assert_array_equal(np.signbit((x * -0.0).numpy()), [True, True])
    np.testing.assert_array_equal((z + 1).numpy(), np.array([2, 3], dtype=np.int32))


def test_the_same_buffer_twice_is_one_hole() -> None:
    a = Tensor([1.0, 2.0], device="NUMPY").realize()
    b = Tensor([3.0, 4.0], device="NUMPY").realize()
    assert _key(a + a) != _key(a + b)
    np.testing.assert_allclose((a + a).numpy(), [2.0, 4.0])
    np.testing.assert_allclose((a + b).numpy(), [4.0, 6.0])


def test_cache_off_and_cleared() -> None:
    clear_caches()
    assert len(plan_cache) == 0
    x = Tensor([1.0, 2.0], device="NUMPY").realize()
    with Context(PLAN_CACHE=0):
        np.testing.assert_allclose((x * 3).numpy(), [3.0, 6.0])
    assert len(plan_cache) == 0
    np.testing.assert_allclose((x * 3).numpy(), [3.0, 6.0])
    assert len(plan_cache) == 1
    assert len(plan_cache) <= plan_cache.limit


def test_assign_through_a_cached_plan_matches_numpy() -> None:
    w = Tensor([1.0, 2.0], device="NUMPY").realize()
    expected = np.array([1.0, 2.0])
    for _ in range(3):
        w.assign(w * 2 + 1).realize()
        expected = expected * 2 + 1
        np.testing.assert_allclose(w.numpy(), expected)
