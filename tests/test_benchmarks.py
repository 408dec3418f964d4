"""The benchmark suite (benchmarks/, not part of `make test`) must not rot: run the tinyteach
part of one small workload end to end with --quick, and check the report's arithmetic."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import data, report  # noqa: E402


def test_tiny_workload_runs_quick(tmp_path: Path) -> None:
    """`run.py --quick` for tinyteach's tiny-kernel workload: one kernel under JIT replay, and
    positive timings in the table and the JSON dump (skipped if the machine is too slow)."""
    out = tmp_path / "out.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick",
               "--frameworks", "tinyteach", "--workloads", "tiny", "--json", str(out)]
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.skip("the quick tiny-kernel benchmark took over 60 s on this machine")
    assert done.returncode == 0, done.stderr
    assert "tiny kernel, JIT replay" in done.stdout
    assert "load average" in done.stdout
    dump = json.loads(out.read_text())
    (entry,) = dump["results"]
    assert "error" not in entry, entry
    assert entry["framework"] == "tinyteach" and entry["workload"] == "tiny"
    assert entry["metrics"]["jit_kernels"] == 1
    assert entry["metrics"]["eager_us"] > 0 and entry["metrics"]["jit_us"] > 0
    assert dump["meta"]["load_before"] and dump["meta"]["quick"] is True


def test_ratios_and_goals() -> None:
    """tinyteach/peer ratios, and goals judged in the right direction."""
    results: report.Results = {
        ("matmul1024", "steady"): {"tinyteach": {"metrics": {"gflops": 60.0}},
                                   "tinygrad": {"metrics": {"gflops": 20.0}},
                                   "numpy": {"metrics": {"gflops": 150.0}}},
        ("tiny", "steady"): {"tinyteach": {"metrics": {"jit_us": 30.0, "jit_kernels": 1}},
                             "tinygrad": {"metrics": {"jit_us": 100.0}},
                             "torch": {"skipped": "no JIT"}},
    }
    row = next(r for r in report.ROWS if r.workload == "matmul1024" and r.metric == "gflops")
    assert report.ratio(results, row, "tinygrad") == pytest.approx(3.0)
    assert report.cell(results, row, "torch") == "-"
    goals = {g["goal"]: g["met"] for g in report.goal_rows(results)}
    assert goals["matmul 1024² GFLOP/s >= 3x tinygrad"] is True
    assert goals["matmul 1024² GFLOP/s >= 50% of numpy"] is False
    assert goals["tiny kernel JIT replay <= 0.2x tinygrad"] is False
    assert goals["JIT replay <= 15 µs per kernel (issue 3)"] is False
    assert goals["fused 4096² in one kernel"] is None  # not measured
    assert "matmul 1024²" in report.format_table(results)


def test_data_is_deterministic_per_workload() -> None:
    """A workload's arrays do not depend on which other workloads are generated with it."""
    alone = data.generate(["tiny"])["tiny_x"]
    together = data.generate(["mlp", "tiny"])["tiny_x"]
    assert (alone == together).all() and alone.dtype.name == "float32"


def test_device_columns_stay_out_of_the_ratios() -> None:
    """The OPENCL/WEBGPU columns show their figures (or n/a, with the reason as a footnote)
    and never change the tinyteach-CPU/peer ratios."""
    results: report.Results = {
        ("softmax", "steady"): {"tinyteach": {"metrics": {"ms": 10.0}},
                                "tinygrad": {"metrics": {"ms": 20.0}},
                                "tinyteach-OPENCL": {"metrics": {"ms": 40.0},
                                                     "notes": ["device OPENCL", "pocl"]},
                                "tinyteach-WEBGPU": {"skipped": "WEBGPU unavailable: no adapter"}},
    }
    row = next(r for r in report.ROWS if r.workload == "softmax" and r.metric == "ms")
    assert report.ratio(results, row, "tinygrad") == pytest.approx(0.5)
    assert report.cell(results, row, "tinyteach-OPENCL") == "40.00"
    assert report.cell(results, row, "tinyteach-WEBGPU") == "n/a"
    table = report.format_table(results)
    assert "tt OPENCL" in table and "tt WEBGPU" in table and "0.50x" in table
    (footnote,) = report.device_footnotes(results)
    assert "tt WEBGPU" in footnote and "no adapter" in footnote and "softmax" in footnote
    assert report.device_notes(results) == ["  tt OPENCL: pocl"]
    cpu_only = {key: {"tinyteach": entries["tinyteach"]} for key, entries in results.items()}
    assert "tt OPENCL" not in report.format_table(cpu_only)


def test_peak_memory_is_reported_next_to_torch() -> None:
    """Peak RSS rows (MB, lower is better) for the training runs, and the issue-16 goals
    against PyTorch judged from the same figures."""
    results: report.Results = {
        ("mlp", "steady"): {"tinyteach": {"metrics": {"ms_step": 2.0, "peak_rss_mb": 60.0}},
                            "torch": {"metrics": {"ms_step": 1.0, "peak_rss_mb": 300.0}}},
        ("mlp", "cold"): {"tinyteach": {"metrics": {"first_step_ms": 250.0}}},
    }
    row = next(r for r in report.ROWS if r.workload == "mlp" and r.metric == "peak_rss_mb")
    assert row.better == "lower" and report.ratio(results, row, "torch") == pytest.approx(0.2)
    assert "MLP peak RSS" in report.format_table(results)
    goals = {g["goal"]: g for g in report.goal_rows(results, report.TORCH_GOALS)}
    assert goals["MLP peak RSS <= torch"]["met"] is True
    assert goals["MLP ms/step <= torch"]["met"] is False
    assert goals["MLP first step, cold cache <= 100 ms"]["shown"] == "250 ms"
    assert goals["CNN peak RSS <= torch"]["met"] is None  # not measured


def test_worker_measures_its_own_peak_memory() -> None:
    """The figure is the worker's own peak resident set: at least what it holds now."""
    from benchmarks import worker
    held = np.ones(20_000_000, dtype=np.uint8)  # 20 MB, touched
    with open("/proc/self/status") as status:
        now_kb = next(int(line.split()[1]) for line in status if line.startswith("VmRSS"))
    peak = worker.peak_rss_mb()
    assert peak >= now_kb * 1024 / 1e6 >= held.nbytes / 1e6


def test_a_worker_does_not_report_its_parents_memory() -> None:
    """run.py holds every workload's data when it starts a worker; the worker's figure is its
    own (getrusage's ru_maxrss would carry the parent's peak across exec)."""
    held = np.ones(300_000_000, dtype=np.uint8)  # 300 MB in this (the parent) process
    code = "from benchmarks.worker import peak_rss_mb; print(peak_rss_mb())"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert 0 < float(done.stdout) < held.nbytes / 1e6 / 2


@pytest.mark.parametrize("workload", ["gpt", "mnist"])
def test_real_models_are_the_same_computation_as_torch(tmp_path: Path, workload: str) -> None:
    """The real-model workloads (issue 25) start from the same weights in tinyteach
    (impl_tiny: the code tinygrad also runs) and in PyTorch: the first two training losses
    agree, so their step times compare one computation."""
    torch = pytest.importorskip("torch")
    from benchmarks.impl_tiny import TinyImpl
    from benchmarks.impl_torch import TorchImpl
    data.save(tmp_path, [workload])
    torch.manual_seed(0)
    theirs = TorchImpl().train_step(workload, data.Data(tmp_path))
    ours = TinyImpl("tinyteach").train_step(workload, data.Data(tmp_path))
    expected = [theirs(i) for i in range(2)]
    got = [ours(i) for i in range(2)]
    assert got == pytest.approx(expected, rel=1e-4), (got, expected)


def test_gpt_forward_and_generation_match_torch(tmp_path: Path) -> None:
    """The GPT workload's forward pass (TinyGPT, tinygrad's API) and its generation step
    (tinyteach's Sampler with the same weights) give PyTorch's logits."""
    pytest.importorskip("torch")
    from benchmarks.impl_tiny import TinyImpl
    from benchmarks.impl_torch import TorchImpl
    data.save(tmp_path, ["gpt"])
    ours, theirs = TinyImpl("tinyteach"), TorchImpl()
    forward = ours.gpt_forward(data.Data(tmp_path))(0)
    np.testing.assert_allclose(forward, theirs.gpt_forward(data.Data(tmp_path))(0).numpy(),
                               atol=1e-4)
    generate, reference = ours.gpt_generate(data.Data(tmp_path)), \
        theirs.gpt_generate(data.Data(tmp_path))
    for position in range(3):
        np.testing.assert_allclose(generate(position), reference(position).numpy(), atol=1e-4)
