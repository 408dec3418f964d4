"""Shared test helpers: which devices to test, and `check`, which compares an op with PyTorch.

`check(tinyteach_fn, torch_fn, inputs, device)` builds the same random inputs for both
libraries, compares the forward values and, for float inputs, the gradients that
`.backward()` produces (through a random output gradient, so every output element matters).
"""
from __future__ import annotations

import ctypes
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from tinyteach import Tensor
from tinyteach.device import Device

ALWAYS = ["NUMPY", "CPU", "PYTHON"]  # PYTHON: the GPU emulator (numpy only, so always here)
OPTIONAL = ["OPENCL", "WEBGPU", "CUDA"]


# the fuzzers' fixed-seed slices: `make test` runs each with its small budget, `make fuzz` with
# TINYTEACH_FUZZ_SCALE times as many cases (and the fuzzers' own long runs)
FUZZ_SCALE = "TINYTEACH_FUZZ_SCALE"


# environment variables that choose the default device (tinygrad's names included): a test
# that runs Python with some of them set starts from none of them
DEVICE_VARIABLES = ("DEV", "NUMPY", "CPU", "OPENCL", "CL", "GPU", "CLANG", "DEBUG")
# a program that prints the default device and a new tensor's device
PRINT_DEFAULT_DEVICE = ("from tinyteach import Device, Tensor\n"
                        "print(Device.DEFAULT, Tensor([1.0]).device)")


def python_with_env(code: str, **env: str) -> subprocess.CompletedProcess:
    """Run `code` in a new Python with `env` set and no other device variable."""
    clean = {k: v for k, v in os.environ.items() if k not in DEVICE_VARIABLES}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**clean, **env}, timeout=120)


def fuzz_budget(cases: int) -> int:
    """How many cases a fuzzer's slice runs: `cases` in `make test`, `cases` times
    TINYTEACH_FUZZ_SCALE (a positive number) in `make fuzz`."""
    scale = os.environ.get(FUZZ_SCALE, "1")
    try:
        factor = float(scale)
    except ValueError:
        factor = -1.0
    if not factor > 0:
        raise ValueError(f"{FUZZ_SCALE}={scale!r}: give a positive number (1 is make test's)")
    return max(1, round(cases * factor))


def test_devices() -> list[str]:
    """NUMPY, CPU and PYTHON always; OPENCL, WEBGPU and CUDA where their libraries, drivers (and for
    CUDA a GPU) exist."""
    return ALWAYS + [name for name in OPTIONAL if Device.is_available(name)]


test_devices.__test__ = False  # type: ignore[attr-defined]  # not a test for pytest


@contextmanager
def default_device(name: str) -> Iterator[str]:
    """Device.DEFAULT is `name` inside the block, so tensors created without `device=` (and
    constants inside ops) land there too; what it was before comes back after."""
    previous = Device.DEFAULT
    Device.DEFAULT = name
    try:
        yield name
    finally:
        Device.DEFAULT = previous


def skip_unless_supported(device: str, *needed: Any) -> None:
    """Skip the test, saying why, when `device` cannot hold one of the `needed` dtypes
    (tinyteach or numpy dtypes): WEBGPU has no 64-bit types, pocl's OpenCL no float16.
    Using such a dtype there raises a clear error (tests/test_backends.py checks that)."""
    import pytest

    from tinyteach.dtype import dtypes
    unsupported = getattr(Device[device], "unsupported_dtypes", {})
    for dtype in map(dtypes.as_dtype, needed):
        if dtype in unsupported:
            pytest.skip(f"{device} cannot hold {dtype.name}: {unsupported[dtype]}")


Input = tuple[int, ...] | np.ndarray | int | float


def make_inputs(inputs: Sequence[Input], low: float = -2.0, high: float = 2.0,
                seed: int = 0) -> list[Any]:
    """Shapes become float32 arrays drawn uniformly from [low, high); arrays and Python
    scalars are passed through unchanged."""
    rng = np.random.default_rng(seed)
    made: list[Any] = []
    for item in inputs:
        if isinstance(item, tuple):
            made.append(rng.uniform(low, high, size=item).astype(np.float32))
        else:
            made.append(item)
    return made


def _is_float_array(value: Any) -> bool:
    return isinstance(value, np.ndarray) and value.dtype.kind == "f"


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (tuple, list)) else [value]


def _to_numpy(value: Any) -> np.ndarray:
    if isinstance(value, Tensor):
        return value.numpy()
    if hasattr(value, "detach"):  # a torch tensor
        return value.detach().numpy()
    return np.asarray(value)


def realize_together(values: Sequence[Any]) -> None:
    """Realize every Tensor among `values` in one schedule, as `Tensor.realize(a, b)` does:
    their kernels are compiled together (one compiler call per device where it can) and a
    subgraph they share is computed once, instead of once per `.numpy()`."""
    tensors = [v for v in values if isinstance(v, Tensor)]
    if tensors:
        tensors[0].realize(*tensors[1:])


def compare(ours: Any, theirs: Any, atol: float, rtol: float, what: str = "value") -> None:
    """Equal shapes and close values (exact for integer and bool results)."""
    ours_np, theirs_np = _to_numpy(ours), _to_numpy(theirs)
    assert ours_np.shape == theirs_np.shape, f"{what}: shape {ours_np.shape} != {theirs_np.shape}"
    if theirs_np.dtype.kind in "biu":
        np.testing.assert_array_equal(ours_np, theirs_np, err_msg=what)
    else:
        np.testing.assert_allclose(ours_np.astype(np.float64), theirs_np.astype(np.float64),
                                   atol=atol, rtol=rtol, err_msg=what)


def check(tinyteach_fn: Callable[..., Any], torch_fn: Callable[..., Any],
          inputs: Sequence[Input], device: str, atol: float = 1e-5, rtol: float = 1e-4,
          grad: bool = True, low: float = -2.0, high: float = 2.0, seed: int = 0,
          grad_atol: float | None = None, grad_rtol: float | None = None) -> None:
    """Run both functions on identical inputs; compare values and (for floats) gradients.

    `inputs` holds shapes (random float32 arrays), numpy arrays, or Python scalars (passed
    to both functions as they are). Functions may return one tensor or a tuple of them."""
    import torch
    arrays = make_inputs(inputs, low, high, seed)
    wants_grad = [grad and _is_float_array(a) for a in arrays]
    ours_in = [Tensor(a, device=device, requires_grad=g or None) if isinstance(a, np.ndarray)
               else a for a, g in zip(arrays, wants_grad)]
    theirs_in = [torch.tensor(a, requires_grad=g) if isinstance(a, np.ndarray) else a
                 for a, g in zip(arrays, wants_grad)]
    ours = _as_list(tinyteach_fn(*ours_in))
    theirs = _as_list(torch_fn(*theirs_in))
    assert len(ours) == len(theirs), f"{len(ours)} outputs != {len(theirs)}"
    realize_together(ours)
    for k, (o, t) in enumerate(zip(ours, theirs)):
        compare(o, t, atol, rtol, f"output {k}")
    if any(wants_grad):
        _check_gradients(ours, theirs, ours_in, theirs_in, wants_grad, device,
                         grad_atol if grad_atol is not None else atol,
                         grad_rtol if grad_rtol is not None else rtol, seed)


def _check_gradients(ours: list[Any], theirs: list[Any], ours_in: list[Any],
                     theirs_in: list[Any], wants_grad: list[bool], device: str,
                     atol: float, rtol: float, seed: int) -> None:
    """Backpropagate sum(output * random cotangent) through both and compare input grads."""
    import torch
    rng = np.random.default_rng(seed + 1)
    our_loss: Tensor | None = None
    their_loss: Any = None
    for o, t in zip(ours, theirs):
        if not (isinstance(o, Tensor) and o.requires_grad and t.dtype.is_floating_point):
            continue
        cotangent = rng.uniform(0.5, 1.5, size=t.shape).astype(np.float32)
        our_term = (o * Tensor(cotangent, device=device)).sum()
        their_term = (t * torch.tensor(cotangent)).sum()
        our_loss = our_term if our_loss is None else our_loss + our_term
        their_loss = their_term if their_loss is None else their_loss + their_term
    if our_loss is None:
        return
    our_loss.backward()
    their_loss.backward()
    realize_together([o.grad for o, g in zip(ours_in, wants_grad) if g])
    for k, (o, t, g) in enumerate(zip(ours_in, theirs_in, wants_grad)):
        if not g:
            continue
        expected = t.grad if t.grad is not None else torch.zeros_like(t)
        assert o.grad is not None, f"input {k} got no gradient"
        compare(o.grad, expected, atol, rtol, f"gradient of input {k}")


# ---- the CPU's builds of one C source, side by side ----

GCC_O0 = ["gcc", "-O0", "-fPIC", "-shared", "-fwrapv", "-x", "c"]  # the fast tier without tcc


def c_builds() -> dict[str, list[str]]:
    """The compile commands whose builds must give the same bits: gcc -O2 for this CPU (the
    optimized tier) and, on x86, for an AVX2 CPU (x86-64-v3, which an AVX-512 CPU runs too:
    another vector instruction set), gcc -O0, and tcc (the fast tier) where it is installed."""
    from tinyteach.runtime.cpu import C_FLAGS, march_flags
    builds = {"gcc -O2": ["gcc", *C_FLAGS, "-x", "c"], "gcc -O0": GCC_O0}
    if platform.machine() in ("x86_64", "AMD64"):
        builds["gcc -O2 x86-64-v3"] = ["gcc", *march_flags("x86-64-v3"), "-x", "c"]
    if shutil.which("tcc"):
        builds["tcc"] = ["tcc", "-shared"]
    return builds


def build_c_library(code: str, command: list[str], directory: Path) -> ctypes.CDLL:
    """`code` built by `command` into a new shared library in `directory`, loaded."""
    library = directory / f"kernels{len(list(directory.iterdir()))}.so"
    subprocess.run([*command, "-o", str(library), "-"], input=code, text=True, check=True,
                   capture_output=True)
    return ctypes.CDLL(str(library))


def libraries_of_every_build(kernels: dict[str, str], directory: Path
                             ) -> Iterator[tuple[str, ctypes.CDLL, list[str]]]:
    """For each of `c_builds()`: its name, one library of the kernels (name -> C source) it can
    build (tcc has no _Float16), and those kernels' names."""
    for build, command in c_builds().items():
        usable = [name for name, code in kernels.items()
                  if build != "tcc" or "_Float16" not in code]
        code = "\n".join(kernels[name] for name in usable)
        yield build, build_c_library(code, command, directory), usable


def run_c_kernel(kernel: Callable[..., object], out: np.ndarray, data: np.ndarray) -> np.ndarray:
    """Call a kernel whose parameters are its output and one input; the output, filled."""
    kernel(out.ctypes.data_as(ctypes.c_void_p), data.ctypes.data_as(ctypes.c_void_p))
    return out
