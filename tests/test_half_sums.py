"""Half and bfloat16 sums accumulate in float32 and round once (issue 14; tinygrad's
sum_acc_dtype, PyTorch's accumulation type): a half matmul is REDUCE_AXIS over CAST(MUL(half,
half)) to float32, then one CAST back, which the tensor-core pattern still matches. Sums, means
and matmuls on every device against torch; and the PYTHON emulator computes bfloat16 exactly
as torch does."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tinyteach import Device, Tensor, clear_caches, dtypes
from tinyteach.codegen.plan import kernel_value
from tinyteach.codegen.wmma import tensor_core_plan
from tinyteach.dtype import from_bfloat16_bits, to_bfloat16_bits
from tinyteach.engine.schedule import create_schedule
from tinyteach.ir.uop import Ops
from tinyteach.opt.heuristic import options_for_renderer
from tinyteach.render.cuda import CUDARenderer


def half_devices() -> list[str]:
    """The devices here that hold float16 (pocl's OpenCL has none)."""
    found = []
    for name in ("NUMPY", "CPU", "OPENCL", "WEBGPU", "PYTHON"):
        if Device.is_available(name) and \
                dtypes.float16 not in getattr(Device[name], "unsupported_dtypes", {}):
            found.append(name)
    return found


HALF_DEVICES = half_devices()


def halves(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=shape).astype(np.float16)


def half_ulp(values: np.ndarray) -> np.ndarray:
    """The spacing of float16 at each value (one rounding step)."""
    return np.spacing(np.abs(values).astype(np.float16)).astype(np.float64)


def test_a_half_matmul_sums_in_float32_and_casts_back_once():
    out = Tensor(halves(20, 30)) @ Tensor(halves(30, 10))
    assert out.dtype == dtypes.float16
    items, _ = create_schedule([out.uop], "PYTHON")
    ast = [item for item in items if item.kind == "kernel"][-1].ast
    value = kernel_value(ast)
    assert value.op is Ops.CAST and value.dtype == dtypes.float16
    reduce = value.src[0]
    while reduce.op is Ops.RESHAPE:  # (the sum's kept axis of size 1 dropped)
        reduce = reduce.src[0]
    assert reduce.op is Ops.REDUCE_AXIS and reduce.dtype == dtypes.float32
    widen = reduce.src[0]
    assert widen.op is Ops.CAST and widen.dtype == dtypes.float32
    assert widen.src[0].op is Ops.MUL and widen.src[0].dtype == dtypes.float16
    plan = tensor_core_plan(ast)  # the tensor-core pattern still matches
    assert plan is not None and plan.dtype_in == dtypes.float16
    assert options_for_renderer(ast, CUDARenderer()).tensor_core


def test_sum_dtype_casts_the_input_and_still_accumulates_in_float32():
    x = np.full(4096, 1 / 3, np.float32)
    got = Tensor(x, device="NUMPY").sum(dtype="float16")
    assert got.dtype == dtypes.float16
    expected = torch.tensor(x).sum(dtype=torch.float16)  # half inputs, float accumulation
    assert got.numpy() == expected.numpy()
    sequential = np.float16(0)  # what a sum in half gives: stuck far below 1365.3
    for value in x.astype(np.float16):
        sequential = np.float16(sequential + value)
    assert abs(float(got.numpy()) - 4096 / 3) < abs(float(sequential) - 4096 / 3) / 10


@pytest.mark.parametrize("device", HALF_DEVICES)
def test_a_long_half_dot_product_is_torchs(device):
    """1 x 4096 @ 4096 x 1 in half: summed in half the error was ~0.2 (CPU 0.198, WEBGPU and
    PYTHON 0.277 against float64 here); in float32, torch's result to within one rounding."""
    clear_caches()
    a, b = halves(1, 4096, seed=1), halves(4096, 1, seed=2)
    got = (Tensor(a, device=device) @ Tensor(b, device=device)).numpy().astype(np.float64)
    theirs = (torch.tensor(a) @ torch.tensor(b)).numpy().astype(np.float64)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    assert np.abs(got - theirs).max() <= half_ulp(theirs).max()
    assert np.abs(got - exact).max() <= half_ulp(exact).max()  # one rounding of the sum
    in_half = np.float16(0)  # the same products summed in half, one after another
    for product in (a[0] * b[:, 0]).astype(np.float16):
        in_half = np.float16(in_half + product)
    assert abs(float(in_half) - exact.item()) > 3 * np.abs(got - exact).max()


@pytest.mark.parametrize("device", HALF_DEVICES)
def test_half_sums_means_and_matmuls_match_torch(device):
    clear_caches()
    x = (halves(6, 3000, seed=3) + np.float16(0.5)).astype(np.float16)
    tx = torch.tensor(x)
    for ours, theirs in ((Tensor(x, device=device).sum(1), tx.sum(1)),
                         (Tensor(x.reshape(-1), device=device).sum(), tx.sum()),
                         (Tensor(x, device=device).mean(1), tx.mean(1))):
        assert ours.dtype == dtypes.float16
        got, want = ours.numpy().astype(np.float64), theirs.numpy().astype(np.float64)
        # a mean divides the half sum in half: at most one more rounding than torch's
        assert np.all(np.abs(got - want) <= 2 * half_ulp(want))
    a, b = halves(40, 300, seed=4), halves(300, 24, seed=5)
    got = (Tensor(a, device=device) @ Tensor(b, device=device)).numpy().astype(np.float64)
    want = (torch.tensor(a) @ torch.tensor(b)).numpy().astype(np.float64)
    # products rounded to half before the float32 sum (tinygrad's; torch and tensor cores keep
    # them exact): up to 2^-12 relative each, random in sign, ~2.4e-3 over 300 of them
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=0.02)


# ---- bfloat16 on the emulator ----

@pytest.fixture
def python_bfloat16():
    """Fresh caches around each bfloat16 test on the emulator."""
    clear_caches()
    yield
    clear_caches()


SPECIAL = np.array([1.0, 1.00390625, 1.01171875, -0.0, np.inf, -np.inf, np.nan, 3.4e38, 1e-40,
                    65504.0, 1 / 3, -2.5], dtype=np.float32)  # ties, -0.0, inf, NaN, ...


def torch_values(t: torch.Tensor) -> np.ndarray:
    return (t.float() if t.dtype == torch.bfloat16 else t).detach().numpy()


def test_the_emulator_computes_bfloat16_as_torch(python_bfloat16):
    y = np.linspace(-3, 3, len(SPECIAL)).astype(np.float32)
    a, b = Tensor(SPECIAL, device="PYTHON").bfloat16(), Tensor(y, device="PYTHON").bfloat16()
    ta, tb = torch.tensor(SPECIAL).bfloat16(), torch.tensor(y).bfloat16()
    cases = [(a, ta), (a + b, ta + tb), (a * b, ta * tb), (a - b, ta - tb),
             (a.sqrt(), ta.sqrt()), (a.maximum(b), ta.maximum(tb)), (a < b, ta < tb),
             ((a < b).where(a, b), torch.where(ta < tb, ta, tb)), (b.int(), tb.int()),
             (b.half(), tb.half()), (a.float(), ta.float()), (b * 0.1, tb * 0.1)]
    for ours, theirs in cases:
        np.testing.assert_array_equal(ours.numpy(), torch_values(theirs))
    x = np.random.default_rng(0).standard_normal((16, 40)).astype(np.float32)
    t, tt = Tensor(x, device="PYTHON").bfloat16(), torch.tensor(x).bfloat16()
    np.testing.assert_array_equal(t.sum(1).numpy(), torch_values(tt.sum(1)))
    np.testing.assert_array_equal(t.max(0).numpy(), torch_values(tt.max(0).values))
    np.testing.assert_array_equal(t.exp().numpy(), torch_values(tt.exp()))


def test_bfloat16_matmuls_on_the_emulator_use_tensor_cores_and_match_float64(python_bfloat16):
    from tinyteach.engine.realize import record_launches
    rng = np.random.default_rng(1)
    words = [to_bfloat16_bits(rng.normal(size=shape).astype(np.float32))
             for shape in ((70, 48), (48, 66))]
    a, b = (from_bfloat16_bits(w) for w in words)
    with record_launches() as launches:
        x = Tensor(a, device="PYTHON").bfloat16().realize()  # bfloat16 buffers: fragments
        y = Tensor(b, device="PYTHON").bfloat16().realize()
        values = (x @ y).numpy()
    assert any(launch.runner is not None and launch.runner.linear.options.tensor_core_block
               for launch in launches)
    expected = a.astype(np.float64) @ b.astype(np.float64)  # exact products, one rounding
    np.testing.assert_allclose(values, expected, rtol=2 ** -8, atol=1e-6)


def test_a_sum_over_two_axes_on_cpu_matches_numpy():
    x = np.random.default_rng(0).normal(size=(6, 3000)).astype(np.float32)
    np.testing.assert_allclose(Tensor(x, device="CPU").sum().numpy(), x.sum(dtype=np.float64),
                               rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("device", HALF_DEVICES)
def test_a_half_mean_rounds_once_as_torchs(device):
    """mean sums and divides a half tensor in float32 and rounds once at the end (tinygrad's
    and PyTorch's way): equal to torch's bit for bit; divided in half it was one rounding off
    for about a fifth of these."""
    clear_caches()
    rng = np.random.default_rng(11)
    for length in (7, 61, 300, 1001):
        x = (rng.normal(size=(4, length)) * 10).astype(np.float16)
        ours = Tensor(x, device=device).mean(1)
        assert ours.dtype == dtypes.float16
        np.testing.assert_array_equal(ours.numpy(), torch.tensor(x).mean(1).numpy())


@pytest.mark.parametrize("device", HALF_DEVICES)
def test_the_gradient_of_a_broadcast_half_sums_in_float32(device):
    """A half matmul's weight gradient sums the broadcast gradient over the batch (the EXPAND
    rule's REDUCE): in float32 and one rounding, as Tensor.sum, not in half (off by ~0.03 at
    64 rows, tinygrad's test_gemm_fp16)."""
    clear_caches()
    x, y = halves(64, 64, seed=3) * 2, halves(64, 64, seed=4)
    a = Tensor(x.astype(np.float32), device=device, requires_grad=True)
    b = Tensor(y.astype(np.float32), device=device, requires_grad=True)
    grad_a, grad_b = a.half().matmul(b.half()).sum().gradient(a, b)
    exact_b = np.repeat(x.astype(np.float64).sum(0)[:, None], 64, axis=1)  # x.T @ ones
    exact_a = np.repeat(y.astype(np.float64).sum(1)[None, :], 64, axis=0)  # ones @ y.T
    for got, exact in ((grad_b, exact_b), (grad_a, exact_a)):
        assert np.abs(got.numpy() - exact).max() <= half_ulp(exact).max()
