"""Where a jitted step's time goes: each kernel of a TinyJit capture, timed on its own.

`kernel_table(launches)` re-runs every recorded launch of a capture (the same compiled program
on the same buffers) `repeats` times and keeps the median, so each row is one kernel's own
time, without Python dispatch. A row: the kernel's name, its output shape, ms, GFLOP/s (the
kernel's operation count, `estimate_ops`, over its time) and the optimizations it was lowered
with (opt/'s words, or "none"). `format_kernel_table` prints the rows slowest first.

Only tinyteach records launches; the other frameworks have no table.
"""
from __future__ import annotations

import statistics
import time
from typing import Any

ROW_FIELDS = ("name", "shape", "ms", "gflops", "options")


def time_launch(launch: Any, repeats: int) -> float:
    """Median seconds of one launch's program on its recorded buffers."""
    if launch.runner is None:  # a copy between devices
        return 0.0
    program, buffers = launch.runner.program, launch.buffers
    program(*buffers)  # warm: pages touched, caches filled as in a step
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        program(*buffers)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def kernel_row(launch: Any, seconds: float) -> dict[str, Any]:
    """One kernel's figures as plain data (for the benchmark's JSON)."""
    runner = launch.runner
    ast = launch.item.ast
    shape = list(ast.src[0].src[1].shape) if ast is not None and ast.src else []
    ops = runner.ops_estimate if runner is not None else 0
    linear = getattr(runner, "linear", None)
    options = linear.applied_opts if linear is not None else []
    return {"name": launch.item.name, "shape": shape, "ms": seconds * 1e3,
            "gflops": ops / seconds / 1e9 if seconds > 0 else 0.0,
            "options": "; ".join(options) or "none"}


def kernel_table(launches: list[Any], repeats: int = 5) -> list[dict[str, Any]]:
    """Every launch of a capture, in launch order, each timed alone (median of `repeats`)."""
    return [kernel_row(launch, time_launch(launch, repeats)) for launch in launches]


def format_kernel_table(rows: list[dict[str, Any]], limit: int = 25) -> str:
    """The `limit` slowest kernels, with their share of the summed kernel time."""
    total = sum(row["ms"] for row in rows) or 1.0
    lines = [f"{'kernel':<34} {'shape':<18} {'ms':>8} {'share':>6} {'GFLOP/s':>8}  options",
             "-" * 100]
    for row in sorted(rows, key=lambda r: -r["ms"])[:limit]:
        shape = "x".join(map(str, row["shape"])) or "-"
        lines.append(f"{row['name'][:34]:<34} {shape[:18]:<18} {row['ms']:8.3f} "
                     f"{row['ms'] / total:6.1%} {row['gflops']:8.2f}  {row['options']}")
    lines.append(f"{len(rows)} kernels, {total:.3f} ms summed (each timed alone)")
    return "\n".join(lines)
