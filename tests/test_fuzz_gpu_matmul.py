"""The matmul fuzzer with GPU options on (issue 14, tests/fuzz_gpu_matmul.py): a fixed-seed slice
on OPENCL, WEBGPU and PYTHON against numpy, every kernel also compiled for CUDA (sm_80), each
kernel with an option drawn among the valid ones (none, group reduction, local tile, tensor
cores), in float32, float16 and bfloat16 (OPENCL and the CUDA compile). The longer run:
`python tests/fuzz_gpu_matmul.py --cases 300 --seed N`."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

from fuzz_gpu_matmul import (  # noqa: E402
    Case,
    available_devices,
    case_arrays,
    cuda_compiler,
    fuzz,
    reference,
    tolerance,
    valid_options,
)

from tinyteach import Tensor  # noqa: E402
from tinyteach.codegen.plan import KernelOptions  # noqa: E402
from tinyteach.engine.schedule import create_schedule  # noqa: E402
from tinyteach.render.cuda import CUDARenderer  # noqa: E402
from tinyteach.render.opencl import OpenCLRenderer  # noqa: E402


def test_fuzzed_matmuls_with_gpu_options_match_numpy():
    devices = available_devices()
    assert "PYTHON" in devices
    report = fuzz(10, devices, seed=22)
    assert report.ok(), "\n\n".join(report.failures[:3])
    kinds = {kind.split(" ")[1].split("=")[0] for kind in report.options}
    assert {"none", "group", "local_tile", "tensor_core"} <= kinds, report.options
    assert sum(count for kind, count in report.options.items()  # one warp per tile or a block
               if kind.startswith("PYTHON tensor_core")) > 0
    if cuda_compiler() is not None:  # (test_tensor_cores.py compiles every tensor-core case)
        assert report.compiled > 0


def test_the_options_drawn_are_the_valid_ones():
    half = Tensor(np.ones((20, 17), np.float16)) @ Tensor(np.ones((17, 9), np.float16))
    items, _ = create_schedule([half.uop], "PYTHON")
    ast = [item for item in items if item.kind == "kernel"][-1].ast
    assert KernelOptions(tensor_core=True) in valid_options(ast, CUDARenderer())
    opencl = valid_options(ast, OpenCLRenderer())  # no tensor cores there
    assert KernelOptions(tensor_core=True) not in opencl
    assert KernelOptions(local_tile=8) in opencl and KernelOptions(group=4) in opencl


def test_the_fuzzer_catches_a_wrong_result():
    # the check can fail: a result off by one element's worth is outside the tolerance
    case = Case(0, 5, 7, 3, "float16", False, True, "none", seed=3)
    arrays = case_arrays(case)
    expected = reference(case, arrays)
    wrong = expected.copy()
    wrong[1, 2] += np.abs(arrays[0]).max()
    rtol, atol = tolerance(case)
    assert np.allclose(expected.astype(np.float16).astype(np.float64), expected, rtol, atol)
    assert not np.allclose(wrong, expected, rtol, atol)
    assert arrays[1].shape == (3, 7)  # b stored transposed


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_reference_is_numpy_matmul(dtype):
    case = Case(2, 4, 6, 5, dtype, True, False, "bias", seed=1)
    a, b, bias = case_arrays(case)
    expected = np.swapaxes(a.astype(np.float64), -1, -2) @ b.astype(np.float64) + bias
    np.testing.assert_allclose(reference(case, [a, b, bias]), expected)
