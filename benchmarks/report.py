"""Turn the workers' results into the table of medians and ratios, the goals of the optimizer
issue (met or not), and a check that every framework trained to the same losses."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PEERS = ("tinygrad", "torch", "numpy")
# tinyteach on its other devices: extra columns, never part of the tt/peer ratios or the goals
DEVICES = ("tinyteach-OPENCL", "tinyteach-WEBGPU")
FRAMEWORKS = ("tinyteach",) + PEERS + DEVICES

# results[(workload, run)][framework] -> the worker's dict; run is "steady", "cold" or "warm"
Results = dict[tuple[str, str], dict[str, dict[str, Any]]]


@dataclass(frozen=True)
class Row:
    """One line of the table: a metric of one workload run, and which direction is better."""

    label: str
    workload: str
    run: str
    metric: str
    better: str  # "lower" or "higher"
    fmt: str = "{:.2f}"


def model_rows(label: str, workload: str) -> list[Row]:
    """The rows of a real model's training (issue 25): its step, kernels per step, the first
    step and the first 30 steps of a fresh process with an empty compile cache, the first step
    with a warm cache, and the process's peak memory."""
    return [Row(f"{label} step, JIT (ms/step)", workload, "steady", "ms_step", "lower"),
            Row(f"{label} kernels/step", workload, "steady", "kernels_step", "lower", "{:.0f}"),
            Row(f"{label} 1st step, cold (ms)", workload, "cold", "first_step_ms", "lower",
                "{:.0f}"),
            Row(f"{label} 30 steps from start, cold (s)", workload, "cold", "cold_steps_s",
                "lower"),
            Row(f"{label} 1st step, warm cache (ms)", workload, "warm", "first_step_ms",
                "lower", "{:.0f}"),
            Row(f"{label} peak RSS (MB)", workload, "steady", "peak_rss_mb", "lower", "{:.0f}")]


ROWS = [
    Row("MLP step, JIT (ms/step)", "mlp", "steady", "ms_step", "lower"),
    Row("MLP kernels/step", "mlp", "steady", "kernels_step", "lower", "{:.0f}"),
    Row("MLP 1st step, cold cache (ms)", "mlp", "cold", "first_step_ms", "lower", "{:.0f}"),
    Row("MLP 2nd step (capture), cold (ms)", "mlp", "cold", "second_step_ms", "lower", "{:.0f}"),
    Row("MLP 30 steps from process start, cold (s)", "mlp", "cold", "cold_steps_s", "lower"),
    Row("MLP 1st step, warm cache (ms)", "mlp", "warm", "first_step_ms", "lower", "{:.0f}"),
    Row("MLP peak RSS of the process (MB)", "mlp", "steady", "peak_rss_mb", "lower", "{:.0f}"),
    Row("CNN step, JIT (ms/step)", "cnn", "steady", "ms_step", "lower"),
    Row("CNN kernels/step", "cnn", "steady", "kernels_step", "lower", "{:.0f}"),
    Row("CNN 1st step, cold cache (ms)", "cnn", "cold", "first_step_ms", "lower", "{:.0f}"),
    Row("CNN 2nd step (capture), cold (ms)", "cnn", "cold", "second_step_ms", "lower", "{:.0f}"),
    Row("CNN 30 steps from process start, cold (s)", "cnn", "cold", "cold_steps_s", "lower"),
    Row("CNN 1st step, warm cache (ms)", "cnn", "warm", "first_step_ms", "lower", "{:.0f}"),
    Row("CNN peak RSS of the process (MB)", "cnn", "steady", "peak_rss_mb", "lower", "{:.0f}"),
    *model_rows("beautiful_mnist CNN b128", "mnist"),
    *model_rows("beautiful_mnist CNN b512", "mnist512"),
    *model_rows("GPT 4x128 train", "gpt"),
    Row("GPT forward, batch 16x64 (ms)", "gpt", "steady", "forward_ms", "lower"),
    Row("GPT generation, KV cache (ms/token)", "gpt", "steady", "token_ms", "lower"),
    Row("matmul 512² (GFLOP/s)", "matmul512", "steady", "gflops", "higher", "{:.1f}"),
    Row("matmul 512², reused inputs (GFLOP/s)", "matmul512", "steady", "gflops_reused", "higher",
        "{:.1f}"),
    Row("matmul 1024² (GFLOP/s)", "matmul1024", "steady", "gflops", "higher", "{:.1f}"),
    Row("matmul 1024², reused inputs (GFLOP/s)", "matmul1024", "steady", "gflops_reused",
        "higher", "{:.1f}"),
    Row("matmul 1024² kernels", "matmul1024", "steady", "kernels", "lower", "{:.0f}"),
    Row("fused ((a+b)*c).relu().sum(1) (GB/s)", "fused", "steady", "gbps", "higher"),
    Row("fused, reused inputs (GB/s)", "fused", "steady", "gbps_reused", "higher"),
    Row("fused kernels", "fused", "steady", "kernels", "lower", "{:.0f}"),
    Row("softmax 4096x1024 (ms)", "softmax", "steady", "ms", "lower"),
    Row("softmax, reused input (ms)", "softmax", "steady", "ms_reused", "lower"),
    Row("softmax kernels", "softmax", "steady", "kernels", "lower", "{:.0f}"),
    Row("layernorm 4096x1024 (ms)", "layernorm", "steady", "ms", "lower"),
    Row("layernorm, reused input (ms)", "layernorm", "steady", "ms_reused", "lower"),
    Row("layernorm kernels", "layernorm", "steady", "kernels", "lower", "{:.0f}"),
    Row("tiny kernel, eager (µs/realize)", "tiny", "steady", "eager_us", "lower", "{:.1f}"),
    Row("tiny kernel, eager, reused input (µs)", "tiny", "steady", "eager_us_reused", "lower",
        "{:.1f}"),
    Row("tiny kernel, JIT replay (µs/call)", "tiny", "steady", "jit_us", "lower", "{:.1f}"),
    Row("deep chain, 10k x+1 (ms per 1k ops)", "deep", "steady", "ms_per_1k_10k", "lower"),
    Row("deep chain, 100k x+1 (ms per 1k ops)", "deep", "steady", "ms_per_1k_100k", "lower"),
    Row("deep chain, 100k/10k per op (1 = linear)", "deep", "steady", "linearity", "lower"),
]


def value(results: Results, workload: str, run: str, framework: str, metric: str) -> Any:
    """A metric, or None when it was not measured (or the worker failed)."""
    entry = results.get((workload, run), {}).get(framework, {})
    return entry.get("metrics", {}).get(metric)


def cell(results: Results, row: Row, framework: str) -> str:
    entry = results.get((row.workload, row.run), {}).get(framework)
    if entry is None:
        return "-"
    if "error" in entry:
        return "error"
    if "skipped" in entry:
        return "n/a"
    number = entry.get("metrics", {}).get(row.metric)
    return "n/a" if number is None else row.fmt.format(number)


def ratio(results: Results, row: Row, peer: str) -> float | None:
    """tinyteach / peer for this row (None if either is missing or the peer is zero)."""
    ours = value(results, row.workload, row.run, "tinyteach", row.metric)
    theirs = value(results, row.workload, row.run, peer, row.metric)
    if ours is None or theirs is None or theirs == 0:
        return None
    return ours / theirs


def table_rows(results: Results) -> list[dict[str, Any]]:
    """The table as dicts (also what --json writes)."""
    rows = []
    for row in ROWS:
        if (row.workload, row.run) not in results:
            continue
        rows.append({"label": row.label, "better": row.better,
                     **{fw: value(results, row.workload, row.run, fw, row.metric)
                        for fw in FRAMEWORKS},
                     **{f"tinyteach/{peer}": ratio(results, row, peer) for peer in PEERS}})
    return rows


def column(framework: str) -> str:
    """A column's heading: "tinyteach-OPENCL" reads "tt OPENCL"."""
    return framework.replace("tinyteach-", "tt ") if framework in DEVICES else framework


def device_footnotes(results: Results) -> list[str]:
    """Why a device column shows n/a or error: one line per (device, reason), naming the
    workloads it concerns (a device that is not installed reads the same on every row)."""
    reasons: dict[tuple[str, str], list[str]] = {}
    for (workload, run), entries in results.items():
        for framework in DEVICES:
            entry = entries.get(framework, {})
            why = entry.get("skipped") or entry.get("error")
            if why:
                kind = "n/a" if "skipped" in entry else "error"
                name = workload if run == "steady" else f"{workload} ({run})"
                reasons.setdefault((framework, f"{kind}: {why}"), []).append(name)
    return [f"  {column(framework)} {why} [{', '.join(dict.fromkeys(names))}]"
            for (framework, why), names in reasons.items()]


def device_notes(results: Results) -> list[str]:
    """One line per device column that ran: the device it ran on, as the worker saw it."""
    lines = []
    for framework in DEVICES:
        for entries in results.values():
            notes = entries.get(framework, {}).get("notes")
            if notes:
                notes = [note for note in notes if not note.startswith("device ")] or notes
                lines.append(f"  {column(framework)}: {'; '.join(notes)}")
                break
    return lines


def format_table(results: Results) -> str:
    """A fixed-width text table: medians per framework, then tinyteach/peer ratios (tinyteach
    on CPU; the device columns come after the peers and take no part in the ratios)."""
    frameworks = [fw for fw in FRAMEWORKS if fw not in DEVICES or any(
        fw in entries for entries in results.values())]
    header = (["workload (median)", "better"] + [column(fw) for fw in frameworks]
              + [f"tt/{peer}" for peer in PEERS])
    lines = []
    for row in ROWS:
        if (row.workload, row.run) not in results:
            continue
        ratios = [ratio(results, row, peer) for peer in PEERS]
        lines.append([row.label, row.better] + [cell(results, row, fw) for fw in frameworks]
                     + ["-" if r is None else f"{r:.2f}x" for r in ratios])
    widths = [max(len(str(line[i])) for line in [header] + lines) for i in range(len(header))]
    render = lambda line: "  ".join(str(text).ljust(width) if i < 2 else str(text).rjust(width)
                                    for i, (text, width) in enumerate(zip(line, widths)))
    rule = "-" * len(render(header))
    return "\n".join([render(header), rule] + [render(line) for line in lines])


# ---- goals (issue 7, plus the JIT replay goal of issue 3) ----

@dataclass(frozen=True)
class Goal:
    text: str
    measure: Callable[[Results], float | None]  # the figure compared with the target
    target: float
    better: str  # "lower" or "higher": which side of the target meets the goal
    shown: str  # how the figure reads, e.g. "{:.2f}x tinygrad"


def _ratio(workload: str, metric: str, peer: str, run: str = "steady"):
    def measure(results: Results) -> float | None:
        ours = value(results, workload, run, "tinyteach", metric)
        theirs = value(results, workload, run, peer, metric)
        return None if ours is None or not theirs else ours / theirs
    return measure


def _ours(workload: str, metric: str, run: str = "steady"):
    return lambda results: value(results, workload, run, "tinyteach", metric)


def _replay_per_kernel(results: Results) -> float | None:
    us, kernels = _ours("tiny", "jit_us")(results), _ours("tiny", "jit_kernels")(results)
    return None if us is None or not kernels else us / kernels


GOALS = [
    Goal("matmul 1024² GFLOP/s >= 3x tinygrad", _ratio("matmul1024", "gflops", "tinygrad"),
         3.0, "higher", "{:.2f}x tinygrad"),
    Goal("matmul 1024² GFLOP/s >= 50% of numpy", _ratio("matmul1024", "gflops", "numpy"),
         0.5, "higher", "{:.0%} of numpy"),
    Goal("fused 4096² GB/s >= tinygrad", _ratio("fused", "gbps", "tinygrad"), 1.0, "higher",
         "{:.2f}x tinygrad"),
    Goal("fused 4096² in one kernel", _ours("fused", "kernels"), 1, "lower", "{:.0f} kernel(s)"),
    Goal("softmax time <= tinygrad", _ratio("softmax", "ms", "tinygrad"), 1.0, "lower",
         "{:.2f}x tinygrad"),
    Goal("layernorm time <= tinygrad", _ratio("layernorm", "ms", "tinygrad"), 1.0, "lower",
         "{:.2f}x tinygrad"),
    Goal("MLP ms/step <= tinygrad", _ratio("mlp", "ms_step", "tinygrad"), 1.0, "lower",
         "{:.2f}x tinygrad"),
    Goal("MLP kernels/step <= tinygrad", _ratio("mlp", "kernels_step", "tinygrad"), 1.0,
         "lower", "{:.2f}x tinygrad"),
    Goal("CNN ms/step <= tinygrad", _ratio("cnn", "ms_step", "tinygrad"), 1.0, "lower",
         "{:.2f}x tinygrad"),
    Goal("CNN kernels/step <= tinygrad", _ratio("cnn", "kernels_step", "tinygrad"), 1.0,
         "lower", "{:.2f}x tinygrad"),
    Goal("tiny kernel JIT replay <= 0.2x tinygrad", _ratio("tiny", "jit_us", "tinygrad"), 0.2,
         "lower", "{:.2f}x tinygrad"),
    Goal("JIT replay <= 15 µs per kernel (issue 3)", _replay_per_kernel, 15.0, "lower",
         "{:.1f} µs/kernel"),
    Goal("MLP first step, cold cache <= 1 s", _ours("mlp", "first_step_ms", "cold"), 1000.0,
         "lower", "{:.0f} ms"),
]


# ---- goals against PyTorch (issue 16: from ahead of tinygrad to level with PyTorch) ----

def _against_torch(text: str, workload: str, metric: str, better: str = "lower",
                   run: str = "steady", target: float = 1.0) -> Goal:
    """A goal on tinyteach / torch for one metric (at most `target` for "lower" metrics)."""
    return Goal(text, _ratio(workload, metric, "torch", run), target, better, "{:.2f}x torch")


TORCH_GOALS = [
    _against_torch("MLP ms/step <= torch", "mlp", "ms_step"),
    _against_torch("CNN ms/step <= torch", "cnn", "ms_step"),
    _against_torch("softmax time <= torch", "softmax", "ms"),
    _against_torch("layernorm time <= torch", "layernorm", "ms"),
    _against_torch("softmax, reused input <= torch", "softmax", "ms_reused"),
    _against_torch("layernorm, reused input <= torch", "layernorm", "ms_reused"),
    _against_torch("matmul 512² GFLOP/s >= torch", "matmul512", "gflops", "higher"),
    _against_torch("matmul 1024² GFLOP/s >= torch", "matmul1024", "gflops", "higher"),
    # issue 25: the real models
    _against_torch("GPT training step <= torch", "gpt", "ms_step"),
    _against_torch("GPT forward <= torch", "gpt", "forward_ms"),
    _against_torch("GPT generation per token <= torch", "gpt", "token_ms"),
    _against_torch("beautiful_mnist b128 step <= torch", "mnist", "ms_step"),
    _against_torch("beautiful_mnist b512 step <= torch", "mnist512", "ms_step"),
    _against_torch("GPT 30 steps from a cold start <= 1.5x torch", "gpt", "cold_steps_s",
                   run="cold", target=1.5),
    _against_torch("beautiful_mnist 30 steps cold <= 1.5x torch", "mnist", "cold_steps_s",
                   run="cold", target=1.5),
    Goal("tiny kernel eager realize <= 20 µs", _ours("tiny", "eager_us"), 20.0, "lower",
         "{:.1f} µs"),
    Goal("MLP first step, cold cache <= 100 ms", _ours("mlp", "first_step_ms", "cold"), 100.0,
         "lower", "{:.0f} ms"),
    _against_torch("MLP peak RSS <= torch", "mlp", "peak_rss_mb"),
    _against_torch("CNN peak RSS <= torch", "cnn", "peak_rss_mb"),
]


def goal_rows(results: Results, goals: list[Goal] | None = None) -> list[dict[str, Any]]:
    """Each goal (issue 7's by default), its figure in this run and whether it is met."""
    rows = []
    for goal in GOALS if goals is None else goals:
        figure = goal.measure(results)
        met = None if figure is None else (
            figure <= goal.target if goal.better == "lower" else figure >= goal.target)
        rows.append({"goal": goal.text, "figure": figure, "met": met,
                     "shown": "not measured" if figure is None else goal.shown.format(figure)})
    return rows


def format_goals(results: Results, goals: list[Goal] | None = None) -> str:
    status = {True: "met", False: "NOT met", None: "n/a"}
    rows = goal_rows(results, goals)
    width = max(len(row["goal"]) for row in rows)
    return "\n".join(f"  {row['goal']:<{width}}  {row['shown']:>18}  {status[row['met']]}"
                     for row in rows)


# ---- the same model, the same losses ----

# BatchNorm models on random labels are chaotic: float32 PyTorch drifts from float64 PyTorch by
# 8e-3 within 4 steps, so they are compared over their first two steps (the same init, then one
# update); the others over every step they trained
CHAOTIC_STEPS = {"mnist": 2, "mnist512": 2}


def loss_agreement(results: Results, reference: str = "torch") -> list[str]:
    """Max |loss - reference loss| over the steps both trained (same data, same init, same
    Adam): a large difference means the frameworks did not measure the same computation."""
    lines = []
    for workload in ("mlp", "cnn", "mnist", "mnist512", "gpt"):
        entries = results.get((workload, "steady"), {})
        ref = entries.get(reference, {}).get("extra", {}).get("losses")
        if not ref:
            continue
        for framework, entry in entries.items():
            losses = entry.get("extra", {}).get("losses")
            if framework == reference or not losses:
                continue
            steps = min(len(losses), len(ref), CHAOTIC_STEPS.get(workload, len(ref)))
            diff = max(abs(a - b) for a, b in zip(losses[:steps], ref[:steps]))
            verdict = "ok" if diff <= 1e-3 * max(1.0, abs(ref[0])) else "MISMATCH"
            lines.append(f"  {workload}: {framework} vs {reference}: max |Δloss| = {diff:.2e} "
                         f"over {steps} steps ({verdict})")
    return lines
