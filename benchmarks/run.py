"""Measure tinyteach side by side with tinygrad 0.14, PyTorch (CPU, eager) and numpy.

    python benchmarks/run.py [--quick] [--json out.json] [--frameworks ...] [--workloads ...]

Every (framework, workload) runs in its own subprocess on the same data (benchmarks/data.py,
fixed numpy seed, written once to a temporary directory). Training workloads run three times in
fresh processes: first step with a cold compile cache (a new, empty cache directory), first step
with that cache now warm, and the steady state (median ms/step after the warm-up steps). The
table prints medians and tinyteach/peer ratios; the goals of the optimizer issue follow.
tinyteach also runs on OPENCL and WEBGPU (columns "tt OPENCL", "tt WEBGPU": DEV=<device>, fewer
repetitions, outside the ratios and goals; n/a with a footnote where a device cannot run).
"""
from __future__ import annotations

import argparse
import compileall
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import data, report  # noqa: E402
from benchmarks.worker import (  # noqa: E402
    DEVICE_FRAMEWORKS,
    FRAMEWORKS,
    RESULT_PREFIX,
    TRAIN_WORKLOADS,
    WORKLOADS,
)


def loadavg() -> str:
    """The 1/5/15-minute load averages (other work on the machine skews every figure)."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def worker_env(framework: str, cache_dir: Path) -> dict[str, str]:
    """The environment of a worker: its own compile cache directory, tinygrad on DEV=CPU,
    tinyteach on DEV=CPU unless it is one of the device columns (DEV=OPENCL, DEV=WEBGPU)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
    for noisy in ("DEBUG", "BEAM", "NOOPT", "VIZ"):  # measure the defaults
        env.pop(noisy, None)
    # Python as a user runs it: importing reads the compiled bytecode (`compile_bytecode`).
    # With PYTHONDONTWRITEBYTECODE (set on some machines), each worker would compile
    # tinyteach's modules from source again, 0.16 s of every cold start, while the peers'
    # installed packages come with their bytecode
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if framework == "tinyteach" or framework in DEVICE_FRAMEWORKS:
        env["TINYTEACH_CACHE"] = str(cache_dir)
        env["DEV"] = DEVICE_FRAMEWORKS.get(framework, "CPU")
    elif framework == "tinygrad":
        env["DEV"] = "CPU"
        env["CACHEDB"] = str(cache_dir / "cache.db")
    return env


def compile_bytecode() -> None:
    """Compile tinyteach's and the benchmarks' modules to bytecode once, before any worker
    starts, as importing them once does on a user's machine (the peers are installed
    packages, compiled when they were installed)."""
    for package in ("tinyteach", "benchmarks"):
        compileall.compile_dir(str(ROOT / package), quiet=1)


def run_worker(framework: str, workload: str, data_dir: Path, cache_dir: Path, quick: bool,
               first: bool, timeout: float) -> dict[str, Any]:
    """Run one worker process and return its result (or an "error" entry)."""
    command = [sys.executable, "-m", "benchmarks.worker", framework, workload,
               "--data", str(data_dir)] + (["--quick"] if quick else []) + (
               ["--first"] if first else [])
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=ROOT, env=worker_env(framework, cache_dir),
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    wall = time.perf_counter() - start
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            result = json.loads(line[len(RESULT_PREFIX):])
            result["wall_s"] = wall
            if "error" in result:
                print(done.stderr[-2000:], file=sys.stderr)
            return result
    return {"error": f"exit {done.returncode}: {done.stderr.strip()[-300:]}"}


def plan(workloads: list[str], frameworks: list[str]) -> list[tuple[str, str, str]]:
    """(workload, run, framework) in order: workload by workload, frameworks interleaved (so a
    change in the machine's load hits them all alike); cold before warm before steady."""
    steps = []
    for workload in workloads:
        runs = ["cold", "warm", "steady"] if workload in TRAIN_WORKLOADS else ["steady"]
        for run in runs:
            steps += [(workload, run, framework) for framework in frameworks]
    return steps


def measure(workloads: list[str], frameworks: list[str], quick: bool,
            timeout: float) -> report.Results:
    """Run every planned worker; results[(workload, run)][framework]."""
    results: report.Results = {}
    compile_bytecode()
    with tempfile.TemporaryDirectory(prefix="tinyteach-bench-") as tmp:
        data_dir = Path(tmp) / "data"
        data.save(data_dir, workloads)
        for workload, run, framework in plan(workloads, frameworks):
            # one cache directory per (framework, workload): "cold" starts it empty, "warm" and
            # "steady" reuse it; the user's own caches are never touched
            cache_dir = Path(tmp) / "cache" / framework / workload
            if run == "cold":
                shutil.rmtree(cache_dir, ignore_errors=True)
            cache_dir.mkdir(parents=True, exist_ok=True)
            print(f"  {workload:<10} {run:<6} {framework:<16} ...", end=" ", file=sys.stderr,
                  flush=True)
            result = run_worker(framework, workload, data_dir, cache_dir, quick,
                                first=run != "steady", timeout=timeout)
            summary = result.get("error") or result.get("skipped") or result.get("metrics")
            print(f"{result.get('wall_s', 0):.1f} s  {summary}", file=sys.stderr, flush=True)
            results.setdefault((workload, run), {})[framework] = result
    return results


def versions() -> dict[str, str]:
    """Installed versions of the peers (without importing them here)."""
    from importlib.metadata import PackageNotFoundError, version
    found = {}
    for package in ("tinyteach", "tinygrad", "torch", "numpy"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "not installed"
    return found


def print_kernel_tables(results: report.Results) -> None:
    """Where each training step's time goes: one table per (workload, framework) that
    recorded its kernels (tinyteach's steady runs)."""
    from benchmarks.kernels import format_kernel_table
    for (workload, run), by_framework in results.items():
        for framework, entry in by_framework.items():
            rows = entry.get("extra", {}).get("kernels")
            if rows:
                print(f"\nkernels of one {workload} step ({framework}, {run} run):")
                print(format_kernel_table(rows))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    parser.add_argument("--json", type=Path, help="also write every figure to this JSON file")
    parser.add_argument("--frameworks", nargs="+", choices=FRAMEWORKS, default=list(FRAMEWORKS))
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--kernels", action="store_true",
                        help="print each training step's kernels, slowest first (always in "
                             "the JSON: extra.kernels)")
    parser.add_argument("--timeout", type=float, default=600,
                        help="seconds before one worker process is given up (default 600)")
    args = parser.parse_args(argv)

    load_before, start = loadavg(), time.perf_counter()
    print(f"tinyteach benchmarks on {platform.machine()}, {os.cpu_count()} cores; "
          f"load average before: {load_before}", file=sys.stderr)
    results = measure(args.workloads, args.frameworks, args.quick, args.timeout)
    load_after, elapsed = loadavg(), time.perf_counter() - start

    print()
    print(report.format_table(results))
    print("\nratio tt/peer = tinyteach / peer: below 1 is better for 'lower' rows, above 1 for "
          "'higher' rows. n/a: not applicable (no JIT, no kernel counter, no autograd, no lazy "
          "graph, or not installed).")
    notes, footnotes = report.device_notes(results), report.device_footnotes(results)
    if notes or footnotes:
        print("device columns: tinyteach itself, each in its own process with DEV=<device> "
              "(fewer repetitions; not in the ratios or goals):")
        print("\n".join(notes + footnotes))
    print(f"load average (1/5/15 min): before {load_before}, after {load_after}; "
          f"{os.cpu_count()} cores; {elapsed:.0f} s in all{' (--quick)' if args.quick else ''}")
    print("\ngoals (issue 7; JIT replay per kernel from issue 3):")
    print(report.format_goals(results))
    print("\ngoals against PyTorch (issue 16):")
    print(report.format_goals(results, report.TORCH_GOALS))
    agreement = report.loss_agreement(results)
    if agreement:
        print("\nsame computation (losses vs torch, same data/init/Adam):")
        print("\n".join(agreement))

    if args.kernels:
        print_kernel_tables(results)

    if args.json:
        dump = {"meta": {"load_before": load_before, "load_after": load_after,
                         "cores": os.cpu_count(), "machine": platform.machine(),
                         "python": platform.python_version(), "versions": versions(),
                         "quick": args.quick, "seconds": elapsed},
                "table": report.table_rows(results), "goals": report.goal_rows(results),
                "torch_goals": report.goal_rows(results, report.TORCH_GOALS),
                "results": [{"workload": w, "run": r, "framework": fw, **entry}
                            for (w, r), by_fw in results.items() for fw, entry in by_fw.items()]}
        args.json.write_text(json.dumps(dump, indent=1))
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
