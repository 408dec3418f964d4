"""No graph walk recurses on graph depth: a 100,000-op chain is an ordinary graph.

Python allows about 1,000 nested calls. Every test here runs at that default limit (never
raised) on graphs far deeper than it, through every stage: building, shapes and value bounds,
scheduling, lowering, rewriting, gradients, realize, the JIT, and freeing the graph again.
Values are checked against numpy (or PyTorch for gradients).
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from tinyteach import Tensor, TinyJit
from tinyteach.codegen.plan import index_value
from tinyteach.dtype import dtypes
from tinyteach.engine.schedule import MAX_KERNEL_DEPTH, create_schedule
from tinyteach.ir.rewrite import graph_rewrite, sum_terms, symbolic
from tinyteach.ir.uop import ALU, Ops, UOp

DEVICES = ["NUMPY", "CPU"]


@pytest.fixture(autouse=True)
def default_recursion_limit() -> Iterator[None]:
    """Each test runs at Python's default recursion limit, and must leave it there."""
    assert sys.getrecursionlimit() == 1000
    yield
    assert sys.getrecursionlimit() == 1000


def start(device: str, size: int = 16) -> tuple[Tensor, np.ndarray]:
    """A realized input (a constant would be folded away before any kernel ran)."""
    data = np.linspace(-2, 2, size, dtype=np.float32)
    return Tensor(data, device=device), data


@pytest.mark.parametrize(("device", "length"), [("NUMPY", 20_000), ("CPU", 100_000)])
def test_chain_of_100k_elementwise_ops(device: str, length: int) -> None:
    """100,000 ops on the compiled device (what the invariant is about: no walk recurses on
    the graph's depth, in the scheduler, lowering or the renderer); 20,000 on NUMPY."""
    x, ref = start(device)
    for k in range(length):  # +1, *0.999, -0.5 in turn (numpy float32 rounds the same way)
        step = k % 3
        if step == 0:
            x, ref = x + 1, ref + np.float32(1)
        elif step == 1:
            x, ref = x * 0.999, ref * np.float32(0.999)
        else:
            x, ref = x - 0.5, ref - np.float32(0.5)
    np.testing.assert_allclose(x.numpy(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_loop_of_500_adds_from_a_constant(device: str) -> None:
    x = Tensor.ones(4, device=device)
    for _ in range(500):
        x = x + 1
    np.testing.assert_array_equal(x.numpy(), np.full(4, 501, np.float32))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("count", [3_000, 10_000])
def test_sum_of_many_separate_tensors(device: str, count: int) -> None:
    rng = np.random.default_rng(0)
    arrays = rng.standard_normal((count, 8)).astype(np.float32)
    tensors = [Tensor(a, device=device) for a in arrays]
    total = tensors[0]
    for t in tensors[1:]:
        total = total + t
    expected = arrays[0].copy()
    for a in arrays[1:]:
        expected = expected + a  # the same order of float32 additions
    np.testing.assert_allclose(total.numpy(), expected, rtol=1e-5, atol=1e-4)


def test_backward_through_a_10k_op_chain() -> None:
    data = np.linspace(-1, 1, 8, dtype=np.float32)
    x = Tensor(data, device="NUMPY", requires_grad=True)
    x_torch = torch.tensor(data, requires_grad=True)
    y, y_torch = x, x_torch
    for k in range(5_000):  # 10,000 ops: a multiply, then a sine
        y, y_torch = y * 1.001, y_torch * 1.001
        y, y_torch = (y.sin(), torch.sin(y_torch)) if k % 2 else (y + 0.01, y_torch + 0.01)
    y.sum().backward()
    y_torch.sum().backward()
    assert x.grad is not None and x_torch.grad is not None
    np.testing.assert_allclose(y.numpy(), y_torch.detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(x.grad.numpy(), x_torch.grad.numpy(), rtol=1e-3, atol=1e-6)


def test_backward_through_1200_realized_steps() -> None:
    """Each step is realized, so the graph behind the loss nests 1,200 realized buffers deep
    (backward replaces each by the graph that computed it)."""
    x = Tensor(np.zeros(4, np.float32), device="NUMPY", requires_grad=True)
    y = x
    for _ in range(1_200):
        y = (y * 1.001 + 1).realize()
    y.sum().backward()
    assert x.grad is not None
    np.testing.assert_allclose(x.grad.numpy(), np.full(4, 1.001 ** 1_200), rtol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_deep_chain_through_reductions_and_movement(device: str) -> None:
    data = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    x, ref = Tensor(data, device=device), data
    for k in range(1_050):  # reshape, permute, add; a reduction every 350 steps (1,050 ops)
        x = x.reshape(4, 3).permute(1, 0) + 0.01
        ref = ref.reshape(4, 3).transpose(1, 0) + np.float32(0.01)
        if k % 350 == 0:
            x = x - x.max(1, keepdim=True) * 0.5
            ref = ref - ref.max(1, keepdims=True) * np.float32(0.5)
    np.testing.assert_allclose(x.numpy(), ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_deep_chain_under_tinyjit(device: str) -> None:
    @TinyJit
    def chain(a: Tensor) -> Tensor:
        for _ in range(3_000):
            a = a * 1.0001 + 0.5
        return a.realize()

    for call in range(4):  # run, capture, then two replays on new inputs
        data = np.full(8, float(call), np.float32)
        expected = data.copy()
        for _ in range(3_000):
            expected = expected * np.float32(1.0001) + np.float32(0.5)
        np.testing.assert_allclose(chain(Tensor(data, device=device)).numpy(), expected,
                                   rtol=1e-5)
    assert chain.calls == 4 and chain.captured is not None


def test_schedule_cuts_a_very_deep_chain_into_kernels() -> None:
    x, _ = start("CPU")
    for _ in range(20_000):
        x = x * 1.0001
    items, becomes = create_schedule([x.uop], "CPU")
    assert len(items) == 20_000 // MAX_KERNEL_DEPTH
    assert all("deep" in item.boundary_reason for item in items[:-1])
    assert items[-1].boundary_reason.startswith("it is an output")
    for item in items:  # no kernel computes a longer chain than the limit
        assert sum(n.op in ALU for n in item.ast.toposort) <= MAX_KERNEL_DEPTH
    assert x.uop in becomes


def test_shape_and_bounds_of_a_deep_uop_chain() -> None:
    """`shape`, `vmin` and `vmax` are cached properties computed from their sources: asked at
    the top of a chain whose nodes never computed them, they fill the chain bottom-up."""
    loop = UOp(Ops.RANGE, dtypes.int32, (), ("g", 0, 10))
    one = UOp.const(dtypes.int32, 1)
    node = loop
    for _ in range(50_000):  # UOp(...) directly: nothing below is computed yet
        node = UOp(Ops.ADD, dtypes.int32, (node, one))
    assert (node.vmin, node.vmax) == (50_000, 50_009)
    assert node.shape == ()
    values = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), (1, 6)).reshape((2, 3))
    for _ in range(50_000):
        values = UOp(Ops.NEG, dtypes.float32, (values,))
    assert values.shape == (2, 3)


def test_rewriting_deep_index_arithmetic() -> None:
    loops = [UOp(Ops.RANGE, dtypes.int32, (), ("r", k, 4)) for k in range(5_000)]
    total = loops[0]
    for loop in loops[1:]:
        total = total + loop
    assert sum_terms(total) == loops
    # (a + b + ...) * 3 distributes into a 5,000-term sum: each result is rewritten in turn
    rewritten = graph_rewrite(total * 3, symbolic)
    assert all(term.op is Ops.MUL for term in sum_terms(rewritten))
    setting = {loop: k % 4 for k, loop in enumerate(loops)}
    assert index_value(rewritten, setting) == 3 * sum(setting.values())


def test_freeing_a_100k_deep_graph() -> None:
    """Python frees a chain of objects by recursion unless it is careful: a 100,000-deep
    chain of UOps must be freed without crashing the process (run in a child process)."""
    code = textwrap.dedent("""
        import gc, sys
        from tinyteach.dtype import dtypes
        from tinyteach.ir.uop import Ops, UOp
        assert sys.getrecursionlimit() == 1000
        node = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), (1, 4))
        for _ in range(100_000):
            node = UOp(Ops.ADD, dtypes.float32, (node, node))
        assert node.shape == (4,) and len(node.toposort) == 100_001
        del node
        gc.collect()
        assert len(UOp.__class__.cache) < 1_000, len(UOp.__class__.cache)
        print("freed")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "freed"


def test_sum_of_many_reductions() -> None:
    """Each of 3,000 reductions sits under the rest of a 3,000-deep sum: the scheduler must not
    walk up that sum once per reduction."""
    arrays = np.random.default_rng(1).standard_normal((3_000, 4)).astype(np.float32)
    tensors = [Tensor(a, device="NUMPY") for a in arrays]
    total = tensors[0].sum()
    for t in tensors[1:]:
        total = total + t.sum()
    np.testing.assert_allclose(total.numpy(), arrays.astype(np.float64).sum(), rtol=1e-4,
                               atol=1e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_chain_reading_each_step_through_two_views(device: str) -> None:
    """Each step reads the last one twice, through different views: fused naively, step k
    would be lowered (and computed) 2^k times. The scheduler stores a value once it is read
    through MAX_VIEWS_PER_NODE different views, so the work stays linear in the depth."""
    data = np.linspace(-1, 1, 6, dtype=np.float32)
    x, ref = Tensor(data, device=device), data
    for _ in range(2_000):
        x = x.pad(((1, 0),)).shrink(((0, 6),)) * 0.5 + x.flip(0) * 0.5
        ref = np.pad(ref, (1, 0))[:6] * np.float32(0.5) + ref[::-1] * np.float32(0.5)
    items, _ = create_schedule([x.uop], device)
    assert any("different views" in item.boundary_reason for item in items)
    np.testing.assert_allclose(x.numpy(), ref, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("device", ["OPENCL", "WEBGPU", "CPU"])
def test_a_chain_of_1000_adds_fits_every_compiler(device: str) -> None:
    """One kernel of 1,000 chained adds: the renderer names an inline expression once it nests
    MAX_INLINE_DEPTH deep, because clang (which OpenCL drivers use) refuses parentheses nested
    past 256. Skips where the device is missing."""
    from tinyteach.device import Device

    reason = Device.why_unavailable(device)
    if reason:
        pytest.skip(f"{device}: {reason}")
    x = Tensor(np.arange(16, dtype=np.float32), device=device)  # integers: exact in any order
    for _ in range(1000):
        x = x + 1
    np.testing.assert_array_equal(x.numpy(), np.arange(16, dtype=np.float32) + 1000)
