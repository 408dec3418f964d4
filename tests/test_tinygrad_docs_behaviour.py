"""Issue 26, group 8: what tinygrad's documentation shows, run on tinyteach — tinygrad's device
names (`DEV=CL`), Python ints wrapping into an integer dtype, a tensor made from a file's
`pathlib.Path`, and `load_state_dict`'s keyword arguments. Where tinygrad's docs print a value,
that value is the expected one here."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tinyteach import Device, Tensor

# ---- tinygrad's device names: CL is OPENCL ----

DEVICE_VARIABLES = ("DEV", "NUMPY", "CPU", "OPENCL", "CL", "GPU", "CLANG", "DEBUG")
DEFAULT = ("from tinyteach import Device, Tensor\n"
           "print(Device.DEFAULT, Tensor([1.0]).device)")
needs_opencl = pytest.mark.skipif(not Device.is_available("OPENCL"),
                                  reason="OPENCL is not available here")


def python_with_env(code: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in DEVICE_VARIABLES}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**clean, **env}, timeout=120)


@needs_opencl
@pytest.mark.parametrize("env", [{"DEV": "CL"}, {"DEV": "cl"}, {"CL": "1"}, {"GPU": "1"}])
def test_tinygrads_opencl_name_chooses_the_default_device(env):
    # env_vars.md's first example is `DEV=CL`; the tensor's device prints the canonical name
    result = python_with_env(DEFAULT, **env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["OPENCL", "OPENCL"]


def test_tinygrads_old_cpu_name_is_the_cpu():
    result = python_with_env(DEFAULT, DEV="CLANG")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["CPU", "CPU"]


@needs_opencl
def test_cl_names_the_opencl_device():
    assert Device["CL"] is Device["OPENCL"] and Device["cl"] is Device["OPENCL"]
    assert Device.canonicalize("CL") == "OPENCL" and Device.canonicalize("CL:0") == "OPENCL"
    x = Tensor([1.0, 2.0], device="CL")
    assert x.device == "OPENCL"
    assert (x * 3).tolist() == [3.0, 6.0]
    assert Tensor([1.0], device="NUMPY").to("CL").device == "OPENCL"


def test_an_unknown_device_name_is_still_a_clear_error():
    with pytest.raises(ValueError, match="unknown device 'CLX'.*OPENCL.*CL"):
        Tensor([1.0], device="CLX")
    result = python_with_env(DEFAULT, DEV="CLX")
    assert result.returncode != 0 and "CLX" in result.stderr and "OPENCL" in result.stderr


def test_an_alias_cannot_be_registered_as_a_new_device():
    with pytest.raises(ValueError, match="CL is a built-in device"):
        Device.register("cl", lambda: Device["NUMPY"])
