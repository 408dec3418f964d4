"""Every kernel of a representative op-suite run compiles for CUDA (issue 14, "Renderers").

The ops run on NUMPY (its schedule is the one a GPU device gets: no CPU packing copies), every
launched kernel is recorded, and each is lowered with the CUDA renderer's own options (group
reductions, local tiles), rendered as CUDA C and compiled by NVRTC for sm_90 (an H100/H200):
PTX and, through ptxas inside NVRTC, machine code. No GPU is needed. tests/conftest.py does the
same to PTX for the op suite's CPU runs; this file adds half precision, training steps and
the cubin, and checks the results of the run against numpy.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from helpers import default_device

from tinyteach import Tensor, dtypes, nn
from tinyteach.device import DeviceUnavailable
from tinyteach.engine.realize import record_launches
from tinyteach.nn.optim import Adam
from tinyteach.runtime.cuda import CUDACompiler, compile_for_cuda, cuda_include_directory

RNG = np.random.default_rng(0)
A = RNG.standard_normal((6, 40)).astype(np.float32)
B = RNG.standard_normal((40, 5)).astype(np.float32)
IMAGES = RNG.standard_normal((2, 3, 9, 9)).astype(np.float32)


def _t(array: np.ndarray) -> Tensor:
    return Tensor(array)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _layernorm(x: np.ndarray) -> np.ndarray:
    return (x - x.mean(axis=1, keepdims=True)) / np.sqrt(x.var(axis=1, keepdims=True) + 1e-5)


def _conv_pool() -> np.ndarray:
    weight = np.linspace(-1, 1, 4 * 3 * 3 * 3, dtype=np.float32).reshape(4, 3, 3, 3)
    return _t(IMAGES).conv2d(_t(weight), padding=1).relu().max_pool2d(2).numpy()


def _conv_pool_reference() -> np.ndarray:
    weight = np.linspace(-1, 1, 4 * 3 * 3 * 3, dtype=np.float32).reshape(4, 3, 3, 3)
    padded = np.pad(IMAGES, ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))
    out = np.maximum(np.einsum("bchwij,ocij->bohw", windows, weight), 0)
    return out[:, :, :8, :8].reshape(2, 4, 4, 2, 4, 2).max(axis=(3, 5))


def _mlp_step() -> np.ndarray:
    """Two Adam steps of a small MLP: forward, backward and the optimizer's kernels."""
    l1, l2 = nn.Linear(40, 16), nn.Linear(16, 3)
    opt = Adam([l1.weight, l1.bias, l2.weight, l2.bias], lr=1e-2)
    labels = Tensor(np.array([0, 1, 2, 1, 0, 2], dtype=np.int32))
    losses = []
    with Tensor.train():
        for _ in range(2):
            opt.zero_grad()
            loss = l2(l1(_t(A)).relu()).sparse_categorical_crossentropy(labels).backward()
            Tensor.realize(loss, *opt.schedule_step())
            losses.append(loss.item())
    return np.array(losses)


# name -> (what runs on tinyteach, numpy's answer or None where only compiling is checked)
PROGRAMS: dict[str, tuple[Callable[[], np.ndarray], Callable[[], np.ndarray] | None]] = {
    "elementwise": (lambda: ((_t(A) + 1) * _t(A).exp() - _t(A).abs().sqrt()).numpy(),
                    lambda: (A + 1) * np.exp(A) - np.sqrt(np.abs(A))),
    "matmul": (lambda: (_t(A) @ _t(B)).relu().numpy(), lambda: np.maximum(A @ B, 0)),
    "reduce_rows": (lambda: _t(A).sum(axis=1).numpy(), lambda: A.sum(axis=1)),
    "reduce_all_max": (lambda: _t(A).max().numpy(), lambda: A.max()),
    "softmax": (lambda: _t(A).softmax(axis=1).numpy(), lambda: _softmax(A)),
    "layernorm": (lambda: _t(A).layernorm(axis=1, eps=1e-5).numpy(), lambda: _layernorm(A)),
    "argmax": (lambda: _t(A).argmax(axis=1).numpy(), lambda: A.argmax(axis=1)),
    "cumsum": (lambda: _t(A).cumsum(axis=1).numpy(), lambda: A.cumsum(axis=1)),
    "pad_flip_shrink": (lambda: _t(A).pad(((1, 1), (2, 0))).flip(1)[1:5, 3:30].numpy(),
                        lambda: np.pad(A, ((1, 1), (2, 0)))[:, ::-1][1:5, 3:30]),
    "gather": (lambda: _t(A)[Tensor(np.array([5, 0, 2], np.int32))].numpy(),
               lambda: A[[5, 0, 2]]),
    "where_compare": (lambda: (_t(A) > 0).where(_t(A), _t(A) * 0.1).numpy(),
                      lambda: np.where(A > 0, A, A * np.float32(0.1))),
    "integers": (lambda: ((_t(A) * 10).cast(dtypes.int32) // 3 % 5).numpy(),
                 lambda: (A * 10).astype(np.int32) // 3 % 5),
    "int8_int64_bool": (lambda: ((_t(A) * 4).cast(dtypes.int8).cast(dtypes.int64) * 3
                                 + (_t(A) > 0).cast(dtypes.int64)).numpy(),
                        lambda: (A * 4).astype(np.int8).astype(np.int64) * 3
                        + (A > 0).astype(np.int64)),
    "arange": (lambda: (Tensor.arange(37) * 2).numpy(), lambda: np.arange(37) * 2),
    "conv_pool": (_conv_pool, _conv_pool_reference),
    "rand": (lambda: Tensor.rand(5, 7).numpy(), None),
    "mlp_adam_steps": (_mlp_step, None),
    "half": (lambda: (_t(A).cast(dtypes.half) * 2).exp2().sum(axis=1).numpy(),
             lambda: np.exp2(A.astype(np.float16) * 2).astype(np.float32).sum(axis=1)),
    "half_matmul": (lambda: (_t(A).cast(dtypes.half) @ _t(B).cast(dtypes.half)).numpy(),
                    lambda: A.astype(np.float16).astype(np.float32)
                    @ B.astype(np.float16).astype(np.float32)),
}


@pytest.fixture(scope="module")
def compiler() -> CUDACompiler:
    try:
        return CUDACompiler("sm_90")
    except DeviceUnavailable as error:
        pytest.skip(str(error))


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_every_kernel_compiles_to_ptx_and_sm90_machine_code(program, compiler):
    run, reference = PROGRAMS[program]
    uses_half = program.startswith("half")
    if uses_half and cuda_include_directory() is None:
        pytest.skip("half needs cuda_fp16.h from a CUDA toolkit (none found)")
    with default_device("NUMPY"), record_launches() as launches:
        got = run()
    if reference is not None:
        np.testing.assert_allclose(got, reference(), rtol=2e-2 if uses_half else 1e-4,
                                   atol=1e-2 if uses_half else 1e-5)
    kernels = [launch for launch in launches if launch.runner is not None]
    assert kernels, "the program launched no kernel"
    for launch in kernels:
        kernel = compile_for_cuda(launch.item.name, launch.item.ast, compiler)
        assert f".entry {launch.item.name}(" in kernel.ptx
        assert kernel.cubin is not None and kernel.cubin.startswith(b"\x7fELF"), \
            f"no sm_90 machine code for {launch.item.name}"


def test_half_kernels_include_cuda_fp16(compiler):
    if cuda_include_directory() is None:
        pytest.skip("no CUDA toolkit headers here")
    with default_device("NUMPY"), record_launches() as launches:
        (_t(A).cast(dtypes.half) + 1).numpy()
    from tinyteach.codegen.lower import lower
    from tinyteach.opt.heuristic import heuristic_plan
    from tinyteach.render.cuda import CUDARenderer
    item = next(launch.item for launch in launches if launch.runner is not None)
    source = CUDARenderer().render(item.name, lower(item.ast, heuristic_plan(item.ast)))
    assert "#include <cuda_fp16.h>" in source
    assert compiler.compile(source).cubin is not None
