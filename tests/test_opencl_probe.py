"""Chapter 9: how the OPENCL device finds an OpenCL that works (runtime/opencl.py).

A platform can be listed and still unable to build a kernel (the pocl inside pyopencl's wheel, on
a CPU its LLVM 14 does not know). The backend probes each candidate device with a tiny kernel and
takes the first that computes the right numbers; when none does, DeviceUnavailable names every
platform tried, the line of its build log that failed, and what to install.

The probes run in subprocesses, because the OpenCL loader reads its environment once per process:
`OCL_ICD_VENDORS` (a folder of `.icd` files) limits the loader to those platforms — pyopencl's own
loader always adds the pocl of its wheel as well — and pocl's `POCL_EXTRA_BUILD_FLAGS` and
`POCL_DEVICES` turn that pocl into one whose builds fail, or one with no device.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tinyteach.device import DeviceUnavailable
from tinyteach.runtime import opencl
from tinyteach.runtime.opencl import candidate_platforms, find_working_device, first_error_line

ROOT = Path(__file__).resolve().parent.parent
DEBIAN_POCL = Path("/etc/OpenCL/vendors/pocl.icd")
# variables of the surrounding run that must not reach the probes (CI's device requirement too)
FOREIGN = ("OPENCL_", "POCL_", "OCL_ICD", "TINYTEACH_")
needs_pyopencl = pytest.mark.skipif(opencl.cl is None, reason="pyopencl is not installed")

# run in a fresh process: is OPENCL available, why not, and does a kernel give numpy's numbers
PROBE_SCRIPT = """
import json, numpy as np
from tinyteach import Tensor
from tinyteach.device import Device
reason = Device.why_unavailable("OPENCL")
result = {"reason": reason}
if reason is None:
    x = np.arange(6, dtype=np.float32)
    result["correct"] = bool(np.allclose((Tensor(x, device="OPENCL") * 2 + 1).numpy(), x * 2 + 1))
    result["platform"] = Device["OPENCL"].cl_device.platform.version
print(json.dumps(result))
"""


def probe_in_subprocess(tmp_path: Path, **environment: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN)}
    env.update(environment)
    done = subprocess.run([sys.executable, "-c", PROBE_SCRIPT], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result: dict = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def empty_vendor_folder(tmp_path: Path) -> str:
    """An ICD folder with no `.icd` file: only the pocl of pyopencl's wheel remains."""
    folder = tmp_path / "vendors"
    folder.mkdir(exist_ok=True)
    return str(folder)


# ---- the choice, with stand-in platforms ----

class FakePlatform:
    def __init__(self, name: str, devices: list[str] | None = None):
        self.name, self.version = name, f"{name} 1.0"
        self.devices = [FakeDevice(d, self) for d in devices or []]

    def get_devices(self) -> list[FakeDevice]:
        return self.devices


class FakeDevice:
    def __init__(self, name: str, platform: FakePlatform):
        self.name, self.platform = name, platform


def test_candidates_put_pocl_first_and_honour_opencl_platform():
    platforms = [FakePlatform("NVIDIA CUDA"), FakePlatform("Portable Computing Language")]
    names = [p.name for p in candidate_platforms(platforms, None)]
    assert names == ["Portable Computing Language", "NVIDIA CUDA"]
    assert [p.name for p in candidate_platforms(platforms, "0")] == ["NVIDIA CUDA"]
    assert [p.name for p in candidate_platforms(platforms, "nvidia")] == ["NVIDIA CUDA"]
    with pytest.raises(DeviceUnavailable, match="matches none"):
        candidate_platforms(platforms, "intel")
    with pytest.raises(DeviceUnavailable, match=r"OPENCL_PLATFORM=5 but the platforms are"):
        candidate_platforms(platforms, "5")
    with pytest.raises(DeviceUnavailable, match="no OpenCL platform.*pocl-opencl-icd"):
        candidate_platforms([], None)


def test_the_first_device_that_passes_the_probe_is_used(monkeypatch):
    broken = FakePlatform("pocl 3.0-rc2", ["pthread-generic"])
    working = FakePlatform("pocl 3.1", ["pthread-skylake"])
    reasons = {"pthread-generic": "error: unknown target CPU 'generic'", "pthread-skylake": None}
    monkeypatch.setattr(opencl, "probe_device", lambda device: reasons[device.name])
    assert find_working_device([broken, working]).name == "pthread-skylake"


def test_no_working_device_names_each_platform_and_its_error(monkeypatch):
    broken = FakePlatform("pocl 3.0-rc2", ["pthread-generic"])
    empty = FakePlatform("Some Vendor")
    monkeypatch.setattr(opencl, "probe_device",
                        lambda device: "error: unknown target CPU 'generic'")
    with pytest.raises(DeviceUnavailable) as raised:
        find_working_device([broken, empty])
    message = str(raised.value)
    assert "'pocl 3.0-rc2'" in message and "pthread-generic" in message
    assert "error: unknown target CPU 'generic'" in message
    assert "'Some Vendor': it has no device" in message
    assert "apt-get install pocl-opencl-icd ocl-icd-libopencl1" in message


def test_first_error_line_finds_the_build_logs_error():
    unknown_cpu = ("clBuildProgram failed: BUILD_PROGRAM_FAILURE - clBuildProgram failed\n\n"
                   "Build on <pyopencl.Device 'pthread-generic' on 'Portable Computing "
                   "Language'>:\n\nerror: unknown target CPU 'generic'\nnote: valid target CPU "
                   "values are: nocona, core2\n\n(options: -I /somewhere)")
    assert first_error_line(unknown_cpu) == "error: unknown target CPU 'generic'"
    linking = "clBuildProgram failed\n\nBuild on x:\n\nError(s) while linking:\nCannot find sym\n"
    assert first_error_line(linking) == "Error(s) while linking: Cannot find sym"
    assert first_error_line("clGetDeviceIDs failed: DEVICE_NOT_FOUND") == \
        "clGetDeviceIDs failed: DEVICE_NOT_FOUND"


# ---- the probe, on the real OpenCL of this machine ----

@needs_pyopencl
def test_a_platform_whose_builds_fail_is_reported_with_its_build_log(tmp_path):
    """Only the wheel's pocl, made unable to build (as on a CPU its LLVM does not know)."""
    result = probe_in_subprocess(tmp_path, OCL_ICD_VENDORS=empty_vendor_folder(tmp_path),
                                 POCL_EXTRA_BUILD_FLAGS="-Dget_global_id(x)=undeclared")
    reason = result["reason"]
    assert reason is not None, "a pocl that cannot build any kernel was taken as working"
    assert "no OpenCL device can build and run a kernel" in reason
    assert "'Portable Computing Language'" in reason and "error" in reason.lower()
    assert "apt-get install pocl-opencl-icd" in reason


@needs_pyopencl
def test_a_platform_with_no_device_is_reported(tmp_path):
    result = probe_in_subprocess(tmp_path, OCL_ICD_VENDORS=empty_vendor_folder(tmp_path),
                                 POCL_DEVICES="no-such-device-type")
    assert result["reason"] is not None
    assert "'Portable Computing Language': it has no device" in result["reason"]


@needs_pyopencl
def test_the_wheels_pocl_alone_works_or_says_why(tmp_path):
    """On CPUs that LLVM 14 knows, pyopencl's pocl runs kernels; on the others the reason is
    its build error. Either way, never a crash and never a wrong number."""
    result = probe_in_subprocess(tmp_path, OCL_ICD_VENDORS=empty_vendor_folder(tmp_path))
    if result["reason"] is None:
        assert result["correct"] and "3.0" in result["platform"]
    else:
        assert "no OpenCL device can build and run a kernel" in result["reason"]
        assert "error" in result["reason"].lower()


@needs_pyopencl
@pytest.mark.skipif(not DEBIAN_POCL.exists(), reason="Debian's pocl-opencl-icd is not installed "
                    "(`make system-deps` installs it as root)")
def test_with_debians_pocl_too_a_working_device_is_found(tmp_path):
    result = probe_in_subprocess(tmp_path)
    assert result["reason"] is None, result["reason"]
    assert result["correct"]


@needs_pyopencl
def test_opencl_tests_skip_with_the_reason_when_no_device_works(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN)}
    env.update(OCL_ICD_VENDORS=empty_vendor_folder(tmp_path), POCL_DEVICES="no-such-device-type")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                           "tests/test_backends.py", "-k", "opencl_float64"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SKIPPED" in done.stdout and "it has no device" in done.stdout
