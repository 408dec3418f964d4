"""Shared pytest fixtures: `device` runs a test once on every available device."""
from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # so test files can `from helpers import ...`

# PyTorch is only the CPU reference here. Its CUDA build (what pip gives a user without the
# local CPU wheel) imports triton from torch.optim, and triton's LLVM crashes the process once
# lavapipe's LLVM is loaded by the WEBGPU device (a segmentation fault, seen with torch 2.13
# and Mesa 22). Without triton, torch runs the same CPU kernels.
sys.modules.setdefault("triton", None)  # type: ignore[arg-type]  # `import triton` fails

from helpers import default_device, test_devices  # noqa: E402

from tinyteach.device import Device  # noqa: E402


@pytest.fixture(params=test_devices())
def device(request: pytest.FixtureRequest) -> Iterator[str]:
    """The device name; Device.DEFAULT is set to it for the test, so tensors created without
    `device=` (and constants inside ops) land there too."""
    with default_device(request.param):
        yield request.param


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


# ---- issue 11: which devices ran tests, which were skipped and why ----
#
# `make test` ends with a table of devices. `.ci/run` sets TINYTEACH_REQUIRE_DEVICES to the devices
# CI installs, and the run fails, naming them, if any of those ran no test: a CI run cannot be
# green because a device quietly skipped everything.

REQUIRE_DEVICES = "TINYTEACH_REQUIRE_DEVICES"
_device_counts: dict[str, dict[str, int]] = {}


def _device_of(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    device = callspec.params.get("device") if callspec is not None else None
    return device if isinstance(device, str) else None


def pytest_runtest_setup(item: pytest.Item) -> None:
    device = _device_of(item)
    if device is not None:  # travels with the report, also from xdist workers
        item.user_properties.append(("device", device))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    device = dict(report.user_properties).get("device")
    if device is None or not (report.when == "call" or report.outcome != "passed"):
        return
    counts = _device_counts.setdefault(device, {"passed": 0, "failed": 0, "skipped": 0})
    counts[report.outcome] += 1


def _required_devices() -> list[str]:
    return [name.upper() for name in os.environ.get(REQUIRE_DEVICES, "").replace(",", " ").split()]


def _ran(device: str) -> int:
    counts = _device_counts.get(device, {})
    return counts.get("passed", 0) + counts.get("failed", 0)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: the controller sees every report and decides
    if any(_ran(device) == 0 for device in _required_devices()) and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: object, exitstatus: int,
                            config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or not (_device_counts or _required_devices()):
        return
    from tinyteach.device import KNOWN_DEVICES
    write = terminalreporter.write_line  # type: ignore[attr-defined]
    write("")
    write("devices: tests that ran on each device (or why it was skipped)")
    write(f"  {'device':<8} {'passed':>7} {'failed':>7} {'skipped':>8}  status")
    for name in KNOWN_DEVICES:
        counts = _device_counts.get(name, {})
        reason = " ".join((Device.why_unavailable(name) or "no test ran on it").split())
        status = "ran" if _ran(name) else f"skipped: {reason}"  # one line, however long
        write(f"  {name:<8} {counts.get('passed', 0):>7} {counts.get('failed', 0):>7} "
              f"{counts.get('skipped', 0):>8}  {status}")
    missing = [device for device in _required_devices() if _ran(device) == 0]
    if missing:
        write(f"FAILED: {REQUIRE_DEVICES} asks for {', '.join(_required_devices())}, but no test "
              f"ran on {', '.join(missing)}", red=True, bold=True)
