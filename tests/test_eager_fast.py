"""The lean eager paths (issue 16): an elementwise op over realized buffers found by its leaves'
numbers (realize.elementwise_key), broadcast constants without a Tensor, the weak registry of
live tensors, and TinyJit's lean replay. Every value is checked against numpy; the structure
(which path ran, what was cached, what was not rebuilt) is checked by counting, never by time."""
from __future__ import annotations

import gc

import numpy as np
import pytest

from tinyteach import Context, Tensor, TinyJit
from tinyteach.engine import realize
from tinyteach.engine.jit import JitError
from tinyteach.engine.realize import elementwise_key, elementwise_plans, plan_cache
from tinyteach.helpers import clear_caches
from tinyteach.tensor.core import AUTOGRAD, LiveTensors

DEVICES = ["CPU", "NUMPY"]


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How often the whole path ran: build_schedule (scheduling) and plan_key (the graph walk)."""
    counts = {"build_schedule": 0, "plan_key": 0}
    for name in counts:
        original = getattr(realize, name)

        def wrapper(*args: object, _name: str = name, _original: object = original) -> object:
            counts[_name] += 1
            return _original(*args)  # type: ignore[operator]
        monkeypatch.setattr(realize, name, wrapper)
    return counts


def _fresh(values: np.ndarray, device: str) -> Tensor:
    return Tensor(values.copy(), device=device).realize()


@pytest.mark.parametrize("device", DEVICES)
def test_a_hit_builds_no_schedule_and_walks_no_graph(device: str,
                                                     counted: dict[str, int]) -> None:
    data = np.arange(16, dtype=np.float32) - 7.5
    x = _fresh(data, device)
    assert elementwise_key((x + 1).uop, device) is not None
    np.testing.assert_array_equal((x + 1).numpy(), data + 1)  # the plan is made (or found)
    before = dict(counted)
    for k in range(5):
        y = _fresh(data * k, device)  # a fresh buffer each time, as an eager loop has
        np.testing.assert_array_equal((y + 1).numpy(), data * k + np.float32(1))
    assert counted == before  # five hits: no scheduling, no walk


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("dtype", "scalar"), [(np.float32, 1.5), (np.float32, 3),
                                               (np.int32, 3), (np.float16, 0.1),
                                               (np.int32, -7), (np.float32, -0.0)])
def test_scalars_in_both_orders_match_numpy(device: str, dtype: type, scalar: float) -> None:
    data = np.array([0, 1, -2, 5, 7, -3], dtype=dtype)
    x, c = _fresh(data, device), np.array(scalar, dtype=dtype)
    cases = [(x + scalar, data + c), (scalar + x, c + data), (x * scalar, data * c),
             (scalar * x, c * data), (x - scalar, data - c), (scalar - x, c - data),
             (x < scalar, data < c), (x.maximum(scalar), np.maximum(data, c))]
    for ours, reference in cases:
        got = ours.numpy()
        assert got.dtype == reference.dtype
        np.testing.assert_array_equal(got, reference)


@pytest.mark.parametrize("device", DEVICES)
def test_special_values_and_signed_zeros_keep_their_own_plans(device: str) -> None:
    data = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -3.5], dtype=np.float32)
    for scalar in (0.0, -0.0, np.inf, -np.inf, float("nan"), 1e-45):
        x = _fresh(data, device)
        with np.errstate(invalid="ignore"):
            expected = data + np.float32(scalar)
        got = (x + scalar).numpy()
        np.testing.assert_array_equal(got, expected)  # NaN where numpy has NaN
        np.testing.assert_array_equal(np.signbit(got), np.signbit(expected))  # -0.0 kept


@pytest.mark.parametrize("device", DEVICES)
def test_broadcasts_views_and_the_same_buffer_twice(device: str) -> None:
    rng = np.random.default_rng(0)
    a, b, row = (rng.standard_normal(s).astype(np.float32) for s in ((3, 4), (3, 4), (4,)))
    x, y, r = _fresh(a, device), _fresh(b, device), _fresh(row, device)
    np.testing.assert_array_equal((x + r).numpy(), a + row)  # a broadcast leaf
    np.testing.assert_array_equal((r * x).numpy(), row * a)
    np.testing.assert_array_equal((x + x).numpy(), a + a)  # one buffer, twice
    np.testing.assert_array_equal((x + y).numpy(), a + b)  # same structure, two buffers
    np.testing.assert_array_equal((x + x).numpy(), a + a)  # and back: not the two-buffer plan
    square = _fresh(rng.standard_normal((4, 4)).astype(np.float32), device)
    expected = square.numpy()
    np.testing.assert_array_equal((square + square.T).numpy(), expected + expected.T)
    np.testing.assert_array_equal((square.T * 2).numpy(), expected.T * 2)
    assert elementwise_key((x + x).uop, device)[0] != elementwise_key((x + y).uop, device)[0]


@pytest.mark.parametrize("device", DEVICES)
def test_dtypes_casts_and_comparisons(device: str) -> None:
    ints = np.array([3, -4, 7, 0], dtype=np.int32)
    halves = np.array([0.5, -1.25, 65504.0, 6e-8], dtype=np.float16)
    i, h = _fresh(ints, device), _fresh(halves, device)
    np.testing.assert_array_equal(i.cast("float32").numpy(), ints.astype(np.float32))
    with np.errstate(over="ignore"):  # 65504 * 2 is inf in float16, as it is here
        np.testing.assert_array_equal((h * 2).numpy(), halves * np.float16(2))
    np.testing.assert_array_equal((i // 2).numpy(), (ints / 2).astype(np.int32))  # C's rounding
    np.testing.assert_array_equal((i < 1).numpy(), ints < 1)
    np.testing.assert_array_equal((-i).numpy(), -ints)
    np.testing.assert_array_equal(i.where(i, 9).numpy(), np.where(ints != 0, ints, 9))
    flags = _fresh(np.array([True, False, True]), device)
    np.testing.assert_array_equal((flags + 2).numpy(), np.array([3, 2, 3]))  # promotes: general


@pytest.mark.parametrize("device", DEVICES)
def test_a_plan_is_reused_after_the_shapes_change(device: str) -> None:
    data = np.arange(24, dtype=np.float32)
    for shape in [(24,), (4, 6), (2, 3, 4), (24,), (6, 4), ()]:
        values = data[: int(np.prod(shape))].reshape(shape) if shape else np.float32(5.0)
        x = _fresh(np.asarray(values, dtype=np.float32), device)
        got = (x * 3 + 1).numpy() if shape else (x + 1).numpy()
        expected = values * np.float32(3) + np.float32(1) if shape else values + np.float32(1)
        assert got.shape == np.shape(expected)
        np.testing.assert_array_equal(got, expected)
    keys = {elementwise_key((_fresh(np.zeros(s, np.float32), device) + 1).uop, device)[0]
            for s in [(24,), (4, 6), (24,)]}
    assert len(keys) == 2  # a shape is part of a leaf's structure


@pytest.mark.parametrize("device", DEVICES)
def test_an_overwritten_buffer_is_never_served_the_old_plan(device: str) -> None:
    data = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    w = _fresh(data, device)
    handle = Tensor(w.uop, device=device)  # the buffer before any assign
    np.testing.assert_array_equal((handle + 1).numpy(), data + 1)  # the plan is cached
    w.assign(w * 2).realize()
    np.testing.assert_array_equal(w.numpy(), data * 2)
    np.testing.assert_array_equal((w + 1).numpy(), data * 2 + 1)  # the new contents
    with pytest.raises(RuntimeError, match="before assign"):
        (handle + 1).realize()  # reads memory assign() overwrote: an error, not a stale plan


@pytest.mark.parametrize("device", DEVICES)
def test_a_lazy_tensor_reading_an_assigned_buffer_keeps_the_old_value(device: str) -> None:
    data = np.array([1.0, -2.0, 4.0], dtype=np.float32)
    w = _fresh(data, device)
    before = w + 1  # lazy: it must see w as it was (the live-tensor registry finds it)
    for _ in range(3):
        w.assign(w * 2 + 1).realize()
    np.testing.assert_array_equal(before.numpy(), data + 1)
    np.testing.assert_array_equal(w.numpy(), ((data * 2 + 1) * 2 + 1) * 2 + 1)


def test_a_setting_changes_the_key_and_the_watched_path_is_whole(counted: dict[str, int],
                                                                 capsys: pytest.CaptureFixture
                                                                 [str]) -> None:
    data = np.arange(8, dtype=np.float32)
    x = _fresh(data, "CPU")
    key = elementwise_key((x + 1).uop, "CPU")
    with Context(NOOPT=1):
        assert elementwise_key((x + 1).uop, "CPU") != key  # settings are in the key
        np.testing.assert_array_equal((x + 1).numpy(), data + 1)
    with Context(DEBUG=1):  # watched: the whole path, which prints the launch
        assert realize.realize_elementwise((x + 2).uop, "CPU") is None
        np.testing.assert_array_equal((x + 2).numpy(), data + 2)
    assert "*** CPU" in capsys.readouterr().out
    with Context(PLAN_CACHE=0):
        assert realize.realize_elementwise((x + 3).uop, "CPU") is None


def test_what_is_not_one_elementwise_op_takes_the_whole_path() -> None:
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    x = _fresh(data, "CPU")
    assert elementwise_key(x.sum(1).uop, "CPU") is None  # a reduction
    assert elementwise_key(((x + 1) * 2).uop, "CPU") is None  # a source is not a leaf
    assert elementwise_key(x.to("NUMPY").uop, "NUMPY") is None  # a copy
    np.testing.assert_array_equal(((x + 1) * 2).numpy(), (data + 1) * 2)
    np.testing.assert_array_equal((x.to("NUMPY") + 1).numpy(), data + 1)


def test_clear_caches_empties_the_lean_table_too() -> None:
    x = _fresh(np.ones(4, np.float32), "CPU")
    (x + 1).realize()
    assert len(elementwise_plans) >= 1
    clear_caches()
    assert len(elementwise_plans) == 0 and len(plan_cache) == 0
    np.testing.assert_array_equal((x + 1).numpy(), np.full(4, 2.0, np.float32))
    assert len(elementwise_plans) == 1 and len(plan_cache) == 1  # one plan, in both tables


def test_the_live_tensor_registry_needs_no_garbage_collector() -> None:
    gc.collect()
    gc.disable()
    try:
        x = _fresh(np.arange(4, dtype=np.float32), "CPU")
        y = x + 1
        key = id(y)
        assert AUTOGRAD.tensors.get(key) is y
        del y  # no cycle holds it: freed now, by its reference count
        assert AUTOGRAD.tensors.get(key) is None
        np.testing.assert_array_equal((x + 1).numpy(), np.arange(4) + 1.0)
    finally:
        gc.enable()


def test_the_live_tensor_registry_stays_bounded_and_ordered() -> None:
    registry = LiveTensors()
    keep = [Tensor([float(i)]) for i in range(10)]
    for tensor in keep:
        registry.add(tensor)
    for _ in range(5000):
        registry.add(Tensor([0.0]))  # each dies at once
    assert len(registry.refs) <= max(1024, 2 * len(keep)) + 1
    assert registry.values() == keep  # the live ones, oldest first
    assert len(registry) == 10 and id(keep[0]) in registry


@pytest.mark.parametrize("device", DEVICES)
def test_lean_jit_replay_matches_numpy_and_checks_its_inputs(device: str) -> None:
    step = TinyJit(lambda a, b: (a * 2 + b).realize())
    rng = np.random.default_rng(1)
    for _ in range(5):
        a, b = (rng.standard_normal(6).astype(np.float32) for _ in range(2))
        got = step(_fresh(a, device), _fresh(b, device)).numpy()
        np.testing.assert_array_equal(got, a * np.float32(2) + b)
    assert step.plain_signature is not None  # the lean replay ran
    a = rng.standard_normal(6).astype(np.float32)
    lazy = _fresh(a, device) + 1  # not a buffer yet: the whole path realizes it first
    np.testing.assert_array_equal(step(lazy, _fresh(a, device)).numpy(),
                                  (a + np.float32(1)) * np.float32(2) + a)
    with pytest.raises(JitError, match="shape"):
        step(_fresh(np.zeros(7, np.float32), device), _fresh(np.zeros(7, np.float32), device))
    with pytest.raises(JitError, match="dtype"):
        step(_fresh(np.zeros(6, np.int32), device), _fresh(np.zeros(6, np.int32), device))


def test_a_jit_with_a_non_tensor_argument_takes_the_checked_path() -> None:
    step = TinyJit(lambda a, scale: (a * scale).realize())
    data = np.arange(5, dtype=np.float32)
    for _ in range(4):
        np.testing.assert_array_equal(step(_fresh(data, "CPU"), 3.0).numpy(), data * 3)
    assert step.plain_signature is None
    with pytest.raises(JitError, match="non-tensor"):
        step(_fresh(data, "CPU"), 4.0)


def test_a_jitted_function_that_returns_nothing_replays_once_per_call() -> None:
    total = _fresh(np.zeros(3, np.float32), "CPU")

    @TinyJit
    def accumulate(x: Tensor) -> None:
        total.assign(total + x).realize()

    step = np.array([1.0, 2.0, -0.5], dtype=np.float32)
    for _ in range(6):
        assert accumulate(_fresh(step, "CPU")) is None
    assert accumulate.plain_signature is not None
    np.testing.assert_array_equal(total.numpy(), step * 6)  # a second replay would add more
