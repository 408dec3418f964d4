"""lower.vectorize: a comparison of float vectors gives a mask (a vector of bools, one per lane),
AND/OR/XOR and comparisons combine masks, and WHERE picks lane by lane with one. So a matmul
whose epilogue compares (gelu, sigmoid, leaky_relu, a NaN guard) keeps its vector tile, where it
used to fall back to a scalar tile. Each is checked against the NUMPY reference, special values
included, on CPU and OPENCL; C and OpenCL have no vectors of bool, so a mask has int lanes."""
from __future__ import annotations

import numpy as np
import pytest
from helpers import test_devices

from tinyteach import Tensor
from tinyteach.codegen.lower import lower, lower_ast, vectorize
from tinyteach.device import Buffer, Device
from tinyteach.dtype import dtypes
from tinyteach.engine.schedule import create_schedule
from tinyteach.ir.uop import Ops
from tinyteach.opt import Kernel, Opt, OptOps
from tinyteach.opt.search import Candidate, Scratch, compile_candidates, output_of

DEVICES = [d for d in test_devices() if d in ("CPU", "OPENCL")]
EPILOGUES = {
    "gelu": lambda y: y.gelu(),
    "sigmoid": lambda y: y.sigmoid(),
    "leaky_relu": lambda y: y.leaky_relu(0.1),
    "nan_guard": lambda y: (y != y).where(0.0, y),
    "clip": lambda y: y.clip(-1.0, 1.0),
}
SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e4, -1e4, 3.0e38, -1.5]


def operands(n: int = 32, k: int = 16, m: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """x @ w whose results include NaN, ±inf, ±0 and ±1e4: x's first rows hold the special
    values, w's first row is 1 and the rest small."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (n, k)).astype(np.float32)
    w = rng.uniform(-0.2, 0.2, (k, m)).astype(np.float32)
    w[0] = 1.0
    for row, value in enumerate(SPECIAL):
        x[row] = 0.0
        x[row, 0] = value
    return x, w


def kernel_of(out: Tensor, device: str):
    return [i for i in create_schedule([out.uop], device)[0] if i.kind == "kernel"][-1]


@pytest.mark.parametrize("epilogue", list(EPILOGUES))
def test_a_comparing_epilogue_keeps_the_cpu_vector_tile(epilogue):
    x, w = operands()
    width = Device["CPU"].capabilities.vector_width
    if not width or 64 % width:
        pytest.skip(f"this CPU's vectors ({width} lanes) do not divide a row of 64")
    item = kernel_of(EPILOGUES[epilogue](Tensor(x) @ Tensor(w)), "CPU")
    plan = Kernel(item.ast, "CPU").apply_opts(
        [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, width), Opt(OptOps.VECTORIZE, 1, width)]
    ).finished_plan()
    vectored = vectorize(lower_ast(item.ast, plan))
    assert vectored is not None
    masks = [n for n in vectored.toposort
             if n.dtype.scalar == dtypes.bool and n.dtype.count == width]
    if epilogue != "leaky_relu":  # (leaky_relu is a MAX: no mask)
        assert masks, "the comparison became a mask vector"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("epilogue", list(EPILOGUES))
def test_matmul_with_an_epilogue_equals_numpy(device, epilogue):
    x, w = operands()
    ours = EPILOGUES[epilogue](Tensor(x, device=device) @ Tensor(w, device=device)).numpy()
    reference = EPILOGUES[epilogue](Tensor(x, device="NUMPY") @ Tensor(w, device="NUMPY"))
    np.testing.assert_allclose(ours, reference.numpy(), rtol=2e-6, atol=1e-6)
    assert np.array_equal(np.signbit(ours[np.isinf(ours)]),
                          np.signbit(reference.numpy()[np.isinf(ours)]))


def run_with_actions(device: str, item, actions: list[Opt], inputs: list[np.ndarray]):
    """The kernel built by `actions`, run once on `inputs`: its output."""
    backend = Device[device]
    spec = backend.renderer.spec(item.name, lower(item.ast, Kernel(item.ast, device)
                                                  .apply_opts(actions).finished_plan()))
    defines = sorted((n for n in item.ast.toposort if n.op is Ops.DEFINE_GLOBAL),
                     key=lambda n: n.arg[0])
    buffers = [Buffer(device, d.arg[1], d.dtype) for d in defines]
    contents = [np.zeros(defines[0].arg[1], defines[0].dtype.np), *inputs]
    candidate = compile_candidates(backend, [Candidate(None, item.name, spec)])[0]
    return output_of(backend, candidate, Scratch(buffers, contents))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("epilogue", ["sigmoid", "nan_guard", "clip"])
def test_masks_by_hand_equal_the_scalar_kernel(device, epilogue):
    """An elementwise kernel vectorized by hand (UPCAST then VECTORIZE), masks and all, gives
    what the scalar kernel gives, value for value: NaN where it is NaN, the sign of 0 and inf."""
    values = np.array(SPECIAL * 8, np.float32)[:64].reshape(8, 8)
    values[4:] = np.linspace(-30, 30, 32, dtype=np.float32).reshape(4, 8)
    item = kernel_of(EPILOGUES[epilogue](Tensor(values, device=device)), device)
    width = Device[device].capabilities.vector_width
    if not width or 8 % width:
        pytest.skip(f"{device}'s vectors do not divide a row of 8")
    vector = run_with_actions(device, item, [Opt(OptOps.UPCAST, 1, 8),
                                             Opt(OptOps.VECTORIZE, 1, width)], [values.ravel()])
    scalar = run_with_actions(device, item, [Opt(OptOps.UPCAST, 1, 8)], [values.ravel()])
    np.testing.assert_allclose(vector, scalar, rtol=2e-7, atol=0)  # (exp2: libm or arithmetic)
    assert np.array_equal(np.isnan(vector), np.isnan(scalar))
    assert np.array_equal(np.signbit(vector), np.signbit(scalar))
