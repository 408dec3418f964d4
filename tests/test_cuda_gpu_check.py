"""scripts/gpu_check.py, the one-shot GPU check (issue 14): its harness, run here on a CPU-emulated
GPU (lavapipe or pocl, PyTorch on the CPU as the peer) with tiny sizes, and `make gpu-check`
without a GPU, which must say why and fail."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tinyteach.device import Device
from tinyteach.runtime.cuda import find_libcuda

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_check.py"
HEADINGS = ["## Op suite", "## TinyJit training", "## Memory bandwidth", "## Benchmarks",
            "## Goals (issue 14)"]


def _load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module
    spec.loader.exec_module(module)
    return module


gpu_check = _load_script()


def test_quick_run_writes_every_section(tmp_path):
    device = next((d for d in ("WEBGPU", "OPENCL") if Device.is_available(d)), None)
    if device is None:
        pytest.skip("neither WEBGPU (lavapipe) nor OPENCL (pocl) runs here")
    pytest.importorskip("torch")
    workloads = ["fused", "mlp_step"]  # a kernel and a training step: both code paths
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", device, "--quick",
                           "--out", str(tmp_path), "--budget", "200", "--workloads", *workloads],
                          cwd=ROOT, capture_output=True, text=True, timeout=260)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    markdown = (tmp_path / "gpu_check.md").read_text()
    assert all(heading in markdown for heading in HEADINGS), markdown
    assert report["probe"]["ok"] and report["probe"]["description"].startswith(device)
    assert report["ops"]["status"] in ("passed", "failed", "timed out")
    if report["ops"]["status"] != "timed out":  # the machine may be too busy for the limit
        assert report["ops"]["status"] == "passed" and report["ops"]["passed"] > 0
    train = report["train"]
    if "error" not in train:
        assert train["ok"] and train["last_loss"] < train["first_loss"]
    assert report["bandwidth"]["gbps"] > 0
    for workload in gpu_check.WORKLOADS:
        ran = report["benchmarks"][workload]
        if workload not in workloads:
            assert ran == {}
            continue
        assert set(ran) == set(gpu_check.FRAMEWORKS)
        assert "skipped" in ran["tinygrad"] or "ms" in ran["tinygrad"]
        for framework in ("tinyteach", "torch"):
            result = ran[framework]
            assert "ms" in result or "timed out" in result.get("error", ""), result
            if "correct" in result:
                assert result["correct"], (workload, framework, result)
    assert [goal["goal"] for goal in report["goals"]] == [g["goal"] for g in
                                                          gpu_check.goals(report)]


def test_make_gpu_check_without_a_gpu_says_why(tmp_path):
    if find_libcuda() is not None:
        pytest.skip("this machine has a CUDA driver")
    done = subprocess.run(["make", "--no-print-directory", "gpu-check",
                           f"GPU_PYTHON={sys.executable}", f"GPU_CHECK_ARGS=--out {tmp_path}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "no CUDA device: no CUDA driver: libcuda.so not found" in done.stdout
    assert json.loads((tmp_path / "gpu_check.json").read_text())["probe"]["ok"] is False


# ---- the parent's pieces ----

def test_pytest_outcomes_read_plain_and_xdist_lines():
    text = ("tests/test_ops.py::test_add[CUDA] PASSED                 [  1%]\n"
            "tests/test_ops.py::test_sub[CUDA] FAILED                 [  2%]\n"
            "[gw1] [ 50%] SKIPPED tests/test_ops.py::test_half[CUDA] \n"
            "[gw0] [ 75%] ERROR tests/test_dtypes.py::test_cast[CUDA-int8] \n")
    assert gpu_check.pytest_outcomes(text) == {
        "tests/test_ops.py::test_add[CUDA]": "PASSED",
        "tests/test_ops.py::test_sub[CUDA]": "FAILED",
        "tests/test_ops.py::test_half[CUDA]": "SKIPPED",
        "tests/test_dtypes.py::test_cast[CUDA-int8]": "ERROR"}


def _report(**benchmarks):
    return {"meta": {"device": "CUDA", "quick": False, "budget_s": 300, "started": "now",
                     "seconds": 12.0},
            "probe": {"description": "CUDA: test"}, "ops": {"error": "timed out after 110 s"},
            "train": None, "bandwidth": {"gbps": 4000.0, "bytes": 1 << 31, "peer": "torch"},
            "benchmarks": {w: benchmarks.get(w, {}) for w in gpu_check.WORKLOADS}, "goals": []}


def test_goals_are_computed_from_the_measurements():
    report = _report(matmul_f16={"tinyteach": {"ms": 4.0}, "torch": {"ms": 1.0}},
                     fused={"tinyteach": {"ms": 1.0, "gbps": 3000.0}, "torch": {"ms": 1.0},
                            "tinygrad": {"ms": 2.0}},
                     softmax={"tinyteach": {"ms": 2.0}, "tinygrad": {"ms": 1.0}})
    half, fused, tinygrad = gpu_check.goals(report)
    assert half["value"] == 0.25 and half["met"] is False
    assert fused["value"] == 0.75 and fused["met"] is True
    assert tinygrad["value"] == 0.5 and tinygrad["met"] is False  # softmax is half as fast


def test_goals_without_measurements_are_not_applicable():
    assert all(goal["value"] is None and goal["met"] is None
               for goal in gpu_check.goals(_report()))


def test_markdown_shows_every_section_even_when_parts_failed():
    report = _report(matmul_f32={"tinyteach": {"error": "timed out after 45 s (stopped)"},
                                 "torch": {"ms": 2.0, "tflops": 68.7},
                                 "tinygrad": {"skipped": "tinygrad is not installed"}})
    report["goals"] = gpu_check.goals(report)
    text = gpu_check.markdown(report)
    assert all(heading in text for heading in HEADINGS)
    assert "| matmul_f32 | error | 68.7 TFLOP/s (2 ms) | n/a |" in text
    assert "- matmul_f32 / tinyteach: timed out after 45 s (stopped)" in text
    assert "timed out after 110 s" in text and "4000 GB/s" in text


def test_budget_gives_each_part_its_limit_or_what_is_left():
    budget = gpu_check.Budget(30)
    assert budget.limit(10) == 10
    assert 27 < budget.limit(100) <= 28
