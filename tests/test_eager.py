"""Eager dispatch and cold start (issue 16): the lean paths of an eager realize give the same
numbers as the general ones (checked against numpy), the plan cache keys on every setting, the
hash-consing table forgets dead nodes, a node's cached order is the walk's order, and DEBUG=2
names the fast tier a CPU launch ran."""
from __future__ import annotations

import threading
import uuid
import weakref

import numpy as np
import pytest

import tinyteach.runtime.cpu as cpu
from tinyteach import Context, Tensor, dtypes
from tinyteach.device import Device
from tinyteach.engine.realize import plan_cache, plan_key, record_launches
from tinyteach.helpers import GlobalCounters, LRUCache
from tinyteach.ir.uop import Ops, UOp, UOpMetaClass, toposort_of

# (tensor dtype, Python scalar, the result's dtype): the scalar fast path takes the first four
# (the scalar adapts to the tensor); the last two promote (a float on ints, an int on bools)
SCALAR_CASES = [(np.float32, 1.5, np.float32), (np.float32, 3, np.float32),
                (np.int32, 3, np.int32), (np.float16, 0.1, np.float16),
                (np.int32, 0.5, np.float32), (np.bool_, 2, np.int32)]


@pytest.mark.parametrize("device", ["NUMPY", "CPU"])
@pytest.mark.parametrize(("dtype", "scalar", "result"), SCALAR_CASES)
def test_a_tensor_and_a_python_scalar_match_numpy(device: str, dtype: type, scalar: float,
                                                  result: type) -> None:
    data = np.array([0, 1, 2, 5], dtype=dtype)
    x = Tensor(data, device=device)
    wide, constant = data.astype(result), np.array(scalar, dtype=result)
    cases = [(x + scalar, wide + constant), (x * scalar, wide * constant),
             (scalar + x, constant + wide)]
    if dtype is not np.bool_:
        cases.append((scalar - x, constant - wide))
    for ours, reference in cases:
        got = ours.numpy()
        assert got.dtype == np.dtype(result)
        np.testing.assert_allclose(got, reference, rtol=1e-3 if result is np.float16 else 0)


def test_a_tensor_and_an_array_or_a_list_still_broadcast() -> None:
    x = Tensor(np.ones((2, 3), dtype=np.float32))
    np.testing.assert_array_equal((x + np.array([1.0, 2.0, 3.0])).numpy(),
                                  np.ones((2, 3)) + np.array([1.0, 2.0, 3.0]))
    np.testing.assert_array_equal((x * [2.0, 3.0, 4.0]).numpy(),
                                  np.ones((2, 3)) * np.array([2.0, 3.0, 4.0]))
    np.testing.assert_array_equal((x + np.float32(0.5)).numpy(), np.full((2, 3), 1.5))


def test_the_scalar_fast_path_keeps_gradients_as_before() -> None:
    x = Tensor([1.0, -2.0, 3.0], requires_grad=True)
    loss = ((x * 3.0 + 1.0) * (2.0 - x)).sum()
    loss.backward()
    values = np.array([1.0, -2.0, 3.0])
    # d/dx (3x+1)(2-x) = 3(2-x) - (3x+1) = 5 - 6x
    assert x.grad is not None
    np.testing.assert_allclose(x.grad.numpy(), 5 - 6 * values, rtol=1e-6)
    constant = Tensor([1.0, 2.0]) + 1.0
    assert constant.requires_grad is None  # neither the tensor nor the scalar asked for one


def test_equal_shapes_are_not_expanded_again() -> None:
    a, b = Tensor([1.0, 2.0]), Tensor([3.0, 4.0])
    nodes = {node.op for node in (a + b).uop.toposort}
    assert Ops.EXPAND not in nodes and Ops.RESHAPE not in nodes
    np.testing.assert_allclose((a + b).numpy(), [4.0, 6.0])


def _random_graph(rng: np.random.Generator) -> Tensor:
    """A small random DAG over two inputs, with shared subgraphs."""
    nodes = [Tensor(rng.standard_normal(4).astype(np.float32)),
             Tensor(rng.standard_normal(4).astype(np.float32))]
    for _ in range(12):
        a, b = (nodes[int(k)] for k in rng.integers(0, len(nodes), 2))
        nodes.append(a * b if rng.integers(2) else a + b.exp2())
    return nodes[-1]


def test_a_cached_order_is_the_order_the_walk_gives() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        root = _random_graph(rng).uop
        for source in root.src:  # give the sources their cached order first: the merge
            _ = source.toposort
        assert root.toposort == toposort_of([root])
        assert len(set(root.toposort)) == len(root.toposort)


def test_the_hash_consing_table_forgets_dead_nodes() -> None:
    value = 1 + uuid.uuid4().int % 10_000  # a constant no other test made
    node = UOp.const(dtypes.int32, value) * 7
    assert UOp.const(dtypes.int32, value) * 7 is node
    dead = [weakref.ref(node), weakref.ref(node.src[0])]  # the product and the constant
    del node
    assert all(ref() is None for ref in dead)
    # the table keeps no entry of a dead node (counting its entries instead would also see
    # other tests' nodes, kept by a cycle, die in between)
    assert all(ref() is not None for ref in list(UOpMetaClass.cache.values()))
    again = UOp.const(dtypes.int32, value) * 7
    assert again.src[0].arg == value


@pytest.mark.parametrize(("dtype", "value"), [(dtypes.float32, 0.1), (dtypes.float16, 0.1),
                                               (dtypes.int8, 300), (dtypes.uint8, -1),
                                               (dtypes.float32, -0.0), (dtypes.bool, 2)])
def test_a_constant_is_stored_as_its_dtype_stores_it(dtype: object, value: float) -> None:
    for _ in range(2):  # the second time from the memo of truncated values
        node = UOp.const(dtype, value)  # type: ignore[arg-type]
        expected = np.array(value).astype(dtype.np).item()  # type: ignore[attr-defined]
        assert node.arg == expected and type(node.arg) is type(expected)
        assert np.signbit(node.arg) == np.signbit(expected)


def test_a_setting_changed_between_realizes_changes_the_plan() -> None:
    x = Tensor([1.0, 2.0], device="NUMPY").realize()
    key = plan_key([(x + 1).uop], "NUMPY")[0]
    with Context(NOOPT=1):
        assert plan_key([(x + 1).uop], "NUMPY")[0] != key
    assert plan_key([(x + 1).uop], "NUMPY")[0] == key


def test_a_plan_hit_counts_what_the_whole_path_counts() -> None:
    x = np.arange(16, dtype=np.float32)
    (Tensor(x, device="CPU") * 2 + 1).realize()  # the plan is made
    counted = []
    for plans in (1, 0):
        with Context(PLAN_CACHE=plans):
            GlobalCounters.reset()
            result = (Tensor(x, device="CPU") * 2 + 1).realize()
            counted.append((GlobalCounters.kernel_count, GlobalCounters.global_mem,
                            GlobalCounters.global_ops))
        np.testing.assert_array_equal(result.numpy(), x * 2 + 1)
    assert counted[0] == counted[1]


def test_a_plan_hit_copies_between_devices() -> None:
    for offset in (1.0, 2.0):  # the second time through the cached plan
        source = Tensor(np.arange(4, dtype=np.float32) + offset, device="NUMPY")
        moved = (source.to("CPU") * 3).realize()
        np.testing.assert_array_equal(moved.numpy(), (np.arange(4) + offset) * 3)
    assert len(plan_cache) > 0


def test_lru_get_is_one_lookup_that_counts_as_a_use() -> None:
    cache: LRUCache[str, int] = LRUCache("test_eager.get", 2)
    cache["a"], cache["b"] = 1, 2
    assert cache.get("a") == 1 and cache.get("missing") is None
    cache["c"] = 3  # "b" was used least recently: it goes
    assert "a" in cache and "b" not in cache
    del LRUCache.every["test_eager.get"]


# ---- the CPU device: its tiers in DEBUG=2 ----

def _compiler() -> cpu.ClangStyleCompiler:
    compiler = Device["CPU"].compiler
    assert isinstance(compiler, cpu.ClangStyleCompiler)
    return compiler


@pytest.fixture
def cache(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TINYTEACH_CACHE", str(tmp_path))
    return tmp_path


def _launch_lines(shown: str) -> list[str]:
    return [line for line in shown.splitlines() if line.startswith("*** CPU")]


def test_debug_2_names_the_fast_tier_a_launch_ran(cache, capsys) -> None:  # type: ignore[no-untyped-def]
    x = Tensor(np.arange(65536, dtype=np.float32) / 65536, device="CPU").realize()
    scale = float(np.float32(1 + uuid.uuid4().int % 1000 / 1e4))  # kernels never built before
    release = threading.Event()
    cpu.background().submit(release.wait, 60)  # hold the optimized build: check the fast tier
    try:
        with Context(DEBUG=2), record_launches() as launches:
            square = (x * scale).reshape(256, 256)  # 256x256 @ 256x256: 2^24 multiply-adds
            first, second = (x * scale).exp2(), square @ square  # the matmul is heavy: it waits
            Tensor.realize(first, second)
        lines = _launch_lines(capsys.readouterr().out)
    finally:
        release.set()
    fast_names = {"tcc", _compiler().fast.unoptimized_name}
    assert len(lines) == len(launches) == 2
    kinds = []
    for line, launch in zip(lines, launches):
        assert launch.runner is not None and launch.runner.source is not None
        spec = launch.runner.spec  # the heavy matmul's says so (render/c.py)
        assert spec is not None
        waits = cpu.starts_optimized(spec.source, spec.heavy)
        kinds.append(waits)
        if waits:  # built optimized at once: the line is as it always was
            assert line.endswith("us"), line
        else:
            assert any(line.endswith(f"us ({name})") for name in fast_names), line
    assert sorted(kinds) == [False, True]
    cpu.wait_for_optimized_builds(timeout=120)
    with Context(DEBUG=2):
        again = (x * scale).exp2().realize()
    shown = capsys.readouterr().out
    assert f"now runs its {_compiler().optimized_tier} build" in shown
    assert _launch_lines(shown)[0].endswith("us")
    expected = np.arange(65536, dtype=np.float32) / 65536 * np.float32(scale)
    np.testing.assert_allclose(first.numpy(), np.exp2(expected), rtol=1e-6)
    np.testing.assert_allclose(again.numpy(), np.exp2(expected), rtol=1e-6)
    matrix = expected.reshape(256, 256).astype(np.float64)
    np.testing.assert_allclose(second.numpy(), matrix @ matrix, rtol=1e-5)
