"""Shared pytest fixtures: `device` runs a test once on every available device."""
from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # so test files can `from helpers import ...`

from helpers import test_devices  # noqa: E402

from tinyteach.device import Device  # noqa: E402


@pytest.fixture(params=test_devices())
def device(request: pytest.FixtureRequest) -> Iterator[str]:
    """The device name; Device.DEFAULT is set to it for the test, so tensors created without
    `device=` (and constants inside ops) land there too."""
    previous = Device.DEFAULT
    Device.DEFAULT = request.param
    yield request.param
    Device.DEFAULT = previous


# ---- issue 4: every kernel the op suite runs on CPU must also compile for CUDA ----

OP_SUITE = {"test_ops.py", "test_creation.py", "test_indexing.py", "test_dtypes.py"}
_cuda_checked: set[object] = set()


def _cuda_compiler() -> object | None:
    """NVRTC or nvcc (no GPU needed), or None where neither is installed."""
    if not hasattr(_cuda_compiler, "cached"):
        try:
            from tinyteach.runtime.cuda import CUDACompiler
            _cuda_compiler.cached = CUDACompiler()  # type: ignore[attr-defined]
        except Exception:  # no CUDA compiler here: the check is skipped, as the test says
            _cuda_compiler.cached = None  # type: ignore[attr-defined]
    return _cuda_compiler.cached  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def kernels_also_compile_for_cuda(request: pytest.FixtureRequest) -> Iterator[None]:
    """For op-suite tests on CPU: render and compile each launched kernel for CUDA too."""
    device = getattr(request.node, "callspec", None)
    on_cpu = device is not None and device.params.get("device") == "CPU"
    if request.node.path.name not in OP_SUITE or not on_cpu or _cuda_compiler() is None:
        yield
        return
    from tinyteach.realize import record_launches
    from tinyteach.runtime.cuda import compile_for_cuda
    with record_launches() as launches:
        yield
    for launch in launches:
        ast = launch.item.ast
        if launch.runner is None or ast in _cuda_checked:
            continue
        _cuda_checked.add(ast)
        if any(n.dtype.name == "float16" for n in ast.toposort):
            continue  # half needs cuda_fp16.h from a CUDA toolkit; pip's NVRTC has none
        kernel = compile_for_cuda(launch.item.name, ast, _cuda_compiler())  # type: ignore[arg-type]
        assert f".entry {launch.item.name}(" in kernel.ptx
