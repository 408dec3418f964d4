"""Shared pytest fixtures: `device` runs a test once on every available device."""
from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

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
#
# Each new kernel is rendered for CUDA after its test, and compiled with the kernels of the
# tests before it in one NVRTC call (a call costs ~45 ms for one kernel, ~15 ms a kernel for
# forty): when CUDA_BATCH kernels wait, and after the last test of a file. A batch that fails
# is compiled kernel by kernel, and the error names the test whose kernel failed.

OP_SUITE = {"test_ops.py", "test_creation.py", "test_indexing.py", "test_dtypes.py"}
CUDA_BATCH = 64
_cuda_checked: set[object] = set()
_cuda_waiting: list[tuple[str, str, str]] = []  # (test id, kernel name, CUDA source)


def _cuda_compiler() -> object | None:
    """NVRTC or nvcc (no GPU needed), or None where neither is installed. The check runs for
    the native CPU target only: a run for another (CPU_ARCH) builds the same CUDA kernels."""
    if not hasattr(_cuda_compiler, "cached"):
        try:
            from tinyteach.runtime.cuda import CUDACompiler
            native = os.environ.get("CPU_ARCH", "native") in ("", "native")
            _cuda_compiler.cached = CUDACompiler() if native else None  # type: ignore[attr-defined]
        except Exception:  # no CUDA compiler here: the check is skipped, as the test says
            _cuda_compiler.cached = None  # type: ignore[attr-defined]
    return _cuda_compiler.cached  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def kernels_also_compile_for_cuda(request: pytest.FixtureRequest) -> Iterator[None]:
    """For op-suite tests on CPU: render each launched kernel for CUDA too (compiled in batches)."""
    device = getattr(request.node, "callspec", None)
    on_cpu = device is not None and device.params.get("device") == "CPU"
    if request.node.path.name not in OP_SUITE or not on_cpu or _cuda_compiler() is None:
        yield
        return
    from tinyteach.engine.realize import record_launches
    from tinyteach.runtime.cuda import render_for_cuda
    with record_launches() as launches:
        yield
    for launch in launches:
        ast = launch.item.ast
        if launch.runner is None or ast in _cuda_checked:
            continue
        _cuda_checked.add(ast)
        if any(n.dtype.name == "float16" for n in ast.toposort):
            continue  # half needs cuda_fp16.h from a CUDA toolkit; pip's NVRTC has none
        name = f"{launch.item.name}_k{len(_cuda_checked)}"  # unique within a batch
        _cuda_waiting.append((request.node.nodeid, name, render_for_cuda(name, ast)))
    if len(_cuda_waiting) >= CUDA_BATCH:
        _compile_waiting_for_cuda()


def _one_translation_unit(sources: list[str]) -> str:
    """Kernels side by side: each in a namespace of its own, so two kernels' device functions
    of one name do not clash (an `extern "C"` kernel keeps its plain name); the preprocessor
    lines, the same in every kernel, go first."""
    directives: dict[str, None] = {}
    bodies = []
    for number, source in enumerate(sources):
        lines = source.splitlines()
        directives.update(dict.fromkeys(line for line in lines if line.startswith("#")))
        body = "\n".join(line for line in lines if not line.startswith("#"))
        bodies.append(f"namespace kernel{number} {{\n{body}\n}}")
    return "\n".join([*directives, *bodies]) + "\n"


def _compile_waiting_for_cuda() -> None:
    from tinyteach.device import CompileError
    waiting = list(_cuda_waiting)
    _cuda_waiting.clear()
    if not waiting:
        return
    compiler: Any = _cuda_compiler()
    try:
        ptx = compiler.compile(_one_translation_unit([source for *_, source in waiting])).ptx
    except CompileError:
        ptx = None
    for test, name, source in waiting:
        if ptx is not None and f".entry {name}(" in ptx:
            continue
        try:  # alone, so that the failure names its kernel and its test
            kernel = compiler.compile(source)
        except CompileError as error:
            raise AssertionError(f"kernel {name} of {test} does not compile for CUDA:\n"
                                 f"{error}") from None
        assert f".entry {name}(" in kernel.ptx, f"kernel {name} of {test}: no entry in its PTX"


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After a file's last test (or a worker's), the kernels still waiting are compiled."""
    if _cuda_waiting and (nextitem is None or nextitem.path != item.path):
        _compile_waiting_for_cuda()


# ---- issue 23: one case of a shape-only parametrization on OPENCL ----
#
# pocl, the CPU OpenCL the suite runs on, compiles a kernel in ~0.5 s (its build, then a work-group
# function at the first launch): 40% of the suite's time went to it. A parametrization that only
# varies shapes, axes or index expressions tests the GPU lowering (render/gpu.py, codegen/lower.py),
# which
# OPENCL shares with WEBGPU, PYTHON (the emulator) and CUDA; the OpenCL C itself is the same ops
# on the same types. Such a test is marked `@pytest.mark.one_case_on_opencl("axis")`: on OPENCL
# its first `axis` runs (with every value of its other parameters), on every other device all.
# `ALL_CASES_ON_OPENCL=1 make test` runs every case on OPENCL too.


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("ALL_CASES_ON_OPENCL") == "1":
        return
    kept, dropped = [], []
    for item in items:
        (dropped if _other_case_on_opencl(item) else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def _other_case_on_opencl(item: pytest.Item) -> bool:
    """Is `item` on OPENCL, marked one_case_on_opencl, and not its parametrization's first case?"""
    marker = item.get_closest_marker("one_case_on_opencl")
    callspec = getattr(item, "callspec", None)
    if marker is None or callspec is None:
        return False
    if not str(callspec.params.get("device", "")).startswith("OPENCL"):
        return False
    return any(callspec.indices.get(name, 0) != 0 for name in marker.args)


# ---- one pytest for the unit tests and nbval (issue 23) ----
#
# `make test` runs the unit tests and nbval's notebooks in one pytest over 2 workers. A notebook's
# cells share one kernel and run in order, so each notebook goes to one worker as a whole, while
# the other worker takes unit tests one by one. (xdist's `--dist loadgroup` would do this with
# marks, but its group suffix does not reach pytest 9's node ids.)


@pytest.hookimpl(optionalhook=True)  # (a pytest without xdist, as scripts/gpu_check.py runs)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class NotebooksWhole(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return path if path.endswith(".ipynb") else nodeid

    return NotebooksWhole(config, log)


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


def _cpu_target() -> str:
    """What the CPU device's C was built for: the -march level, its lanes, the compiler."""
    from tinyteach.runtime.cpu import describe_target
    try:
        return describe_target()
    except Exception as error:  # a bad CPU_ARCH or no compiler: the tests said so already
        return f"unknown: {error}"


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
        if name == "CPU" and _ran(name):
            status += f" (built for {_cpu_target()})"
        write(f"  {name:<8} {counts.get('passed', 0):>7} {counts.get('failed', 0):>7} "
              f"{counts.get('skipped', 0):>8}  {status}")
    missing = [device for device in _required_devices() if _ran(device) == 0]
    if missing:
        write(f"FAILED: {REQUIRE_DEVICES} asks for {', '.join(_required_devices())}, but no test "
              f"ran on {', '.join(missing)}", red=True, bold=True)
