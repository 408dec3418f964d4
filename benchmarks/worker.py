"""One framework, one workload, in its own process: `python -m benchmarks.worker FRAMEWORK
WORKLOAD --data DIR [--quick] [--first]`. Prints one line `BENCH_RESULT {json}` on stdout.

The protocols live here, once for every framework; the `impl_*` modules only say how each
framework makes a tensor, synchronizes, and computes each workload."""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

# "from process start": the clock starts before any framework (or numpy) is imported
PROCESS_START = time.perf_counter()

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.data import DEEP_LENGTHS, FUSED_N, MATMUL_SIZES, NORM_SHAPE, Data  # noqa: E402
from benchmarks.timing import time_batches, time_runs  # noqa: E402

# tinyteach on its other devices: the same implementation, in its own process with DEV=<device>
DEVICE_FRAMEWORKS = {"tinyteach-OPENCL": "OPENCL", "tinyteach-WEBGPU": "WEBGPU"}
FRAMEWORKS = ("tinyteach", "tinygrad", "torch", "numpy") + tuple(DEVICE_FRAMEWORKS)
TRAIN_WORKLOADS = ("mlp", "cnn", "mnist", "mnist512", "gpt")
WORKLOADS = TRAIN_WORKLOADS + tuple(f"matmul{n}" for n in MATMUL_SIZES) + (
    "fused", "softmax", "layernorm", "tiny", "deep")
# the real models' steps are long: fewer steady steps (the cold run still trains COLD_STEPS)
LONG_STEPS = {"mnist512": (10, 3), "gpt": (20, 5), "mnist": (20, 5)}
COLD_STEPS = 30  # a cold run: "30 steps from process start, empty compile cache"
RESULT_PREFIX = "BENCH_RESULT "

# (default, --quick) repetition counts
REPEATS = {"train_warmup": (3, 3), "train_steps": (30, 5), "matmul": (7, 3), "fused": (5, 2),
           "norm": (10, 3), "tiny_eager": (7, 3), "tiny_jit": (7, 3),
           "tiny_eager_batch": (200, 50), "tiny_jit_batch": (500, 100)}


# the CPU-emulated GPU devices (pocl, lavapipe) are slow: fewer repetitions in a full run
DEVICE_REPEATS = {"train_steps": 15, "matmul": 5, "norm": 5, "tiny_eager_batch": 100,
                  "tiny_jit_batch": 300}


def repeats(name: str, quick: bool, device: bool = False) -> int:
    count = REPEATS[name][1 if quick else 0]
    return min(count, DEVICE_REPEATS.get(name, count)) if device else count


def reps(impl: Any, name: str, quick: bool) -> int:
    """The repetition count of `name` for this implementation (fewer on the emulated GPUs)."""
    return repeats(name, quick, getattr(impl, "emulated_device", False))


def load_impl(framework: str) -> Any:
    """The implementation object of `framework` (imported only in this process)."""
    if framework in ("tinyteach", "tinygrad"):
        from benchmarks.impl_tiny import TinyImpl
        try:
            return TinyImpl(framework)
        except ModuleNotFoundError as error:  # a peer that is not installed: n/a, not an error
            raise NotImplementedError(f"{framework} is not installed ({error})") from error
    if framework in DEVICE_FRAMEWORKS:
        from benchmarks.impl_tiny import TinyImpl
        return TinyImpl("tinyteach", device=DEVICE_FRAMEWORKS[framework])
    if framework == "torch":
        from benchmarks.impl_torch import TorchImpl
        return TorchImpl()
    if framework == "numpy":
        from benchmarks.impl_numpy import NumpyImpl
        return NumpyImpl()
    raise ValueError(f"unknown framework {framework!r}; choose from {FRAMEWORKS}")


def settle(impl: Any) -> None:
    """After the warm-up, before the clock: let a framework finish compiling in the background
    (tinyteach's optimized builds, TinyImpl.settle); the others have nothing to wait for."""
    getattr(impl, "settle", lambda: None)()


def ms(seconds: float) -> float:
    return seconds * 1e3


def peak_rss_mb() -> float:
    """The most memory this worker process has held so far (its peak resident set, in MB of
    10^6 bytes): imports, data, the framework's caches and every step's tensors. Each
    (framework, workload) has a process of its own, so this is the framework's own figure.

    Read from /proc/self/status (VmHWM, the peak of this process's own memory), not from
    getrusage: Linux carries ru_maxrss across exec, so a worker would report the peak of
    run.py, which forked it while holding every workload's data."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024 / 1e6  # kB (KiB) -> MB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6  # no /proc: KiB


# ---- training steps ----

def train_first(impl: Any, kind: str, data: Data) -> dict[str, Any]:
    """A fresh process: the first and second steps (compile, then JIT capture), and the
    seconds from process start to the end of step COLD_STEPS (imports, data, model, compiles
    and every step: what a user waits for; --quick too, as its row and goal say 30 steps)."""
    step = impl.train_step(kind, data)
    start = time.perf_counter()
    loss1 = step(0)
    first = time.perf_counter() - start
    start = time.perf_counter()
    loss2 = step(1)
    second = time.perf_counter() - start
    losses = [loss1, loss2] + [step(i) for i in range(2, COLD_STEPS)]
    total = time.perf_counter() - PROCESS_START
    return {"metrics": {"first_step_ms": ms(first), "second_step_ms": ms(second),
                        "cold_steps_s": total},
            "extra": {"losses": losses, "cold_steps": COLD_STEPS}}


def train_steady(impl: Any, kind: str, data: Data, quick: bool) -> dict[str, Any]:
    """ms per step (median) after the warm-up steps, kernels per replayed step, and the
    process's peak memory over the whole run (and before the first step, in "extra")."""
    step = impl.train_step(kind, data)
    rss_before = peak_rss_mb()
    warmup, steps = repeats("train_warmup", quick), reps(impl, "train_steps", quick)
    if kind in LONG_STEPS:
        steps = min(steps, LONG_STEPS[kind][1 if quick else 0])
    losses, warm_times, times = [], [], []
    for i in range(warmup):
        start = time.perf_counter()
        losses.append(step(i))
        warm_times.append(time.perf_counter() - start)
    settle(impl)
    if impl.counts_kernels:
        reset, read = impl.kernel_counter()
        reset()
    for i in range(warmup, warmup + steps):
        start = time.perf_counter()
        losses.append(step(i))
        times.append(time.perf_counter() - start)
    kernels = read() / steps if impl.counts_kernels else None
    extra = {"warmup_ms": [ms(t) for t in warm_times], "step_ms": [ms(t) for t in times],
             "losses": losses, "peak_rss_mb_before_training": rss_before}
    rows = impl.kernel_rows(5 if quick else 15) if hasattr(impl, "kernel_rows") else None
    if rows is not None:  # where the step's time goes, kernel by kernel (benchmarks/kernels.py)
        extra["kernels"] = rows
    metrics = {"ms_step": ms(statistics.median(times)), "kernels_step": kernels,
               "peak_rss_mb": peak_rss_mb()}
    if kind == "gpt":
        inference = gpt_inference(impl, data, quick)
        extra["skipped"] = inference.pop("skipped", [])
        metrics.update(inference)
    return {"metrics": metrics, "extra": extra}


def gpt_inference(impl: Any, data: Data, quick: bool) -> dict[str, Any]:
    """The GPT's forward pass over a batch (ms) and one generated token through a KV cache
    (ms per token, over every position of the context), medians after warm-up; None where a
    framework has no such path (the reason under "skipped")."""
    figures: dict[str, Any] = {}
    for name, make, count in (("forward_ms", impl.gpt_forward, 5 if quick else 20),
                              ("token_ms", impl.gpt_generate, 64 if quick else 128)):
        try:
            run = make(data)
        except NotImplementedError as why:
            figures[name] = None
            figures.setdefault("skipped", []).append(f"{name}: {why}")
            continue
        for i in range(3):
            run(i)
        settle(impl)
        times = []
        for i in range(3, 3 + count):
            start = time.perf_counter()
            impl.sync(run(i))
            times.append(time.perf_counter() - start)
        figures[name] = ms(statistics.median(times))
    return figures


# ---- single kernels ----

def kernel_workload(impl: Any, fn: Callable[..., Any], arrays: list[Any], warmup: int,
                    count: int) -> tuple[Any, Any, int | None]:
    """Time `fn` on fresh tensors of `arrays` for every run, then on one set of tensors reused
    by every run (as a training loop reuses its memory); also count the kernels of one more
    call. Returns (fresh timings, reused timings, kernels)."""
    prepare = lambda: [impl.tensor(a) for a in arrays]
    impl.sync(fn(*prepare()))  # compile, then let background builds finish
    settle(impl)
    fresh = time_runs(prepare, lambda inputs: fn(*inputs), impl.sync, warmup, count)
    inputs = prepare()
    reused = time_runs(lambda: inputs, lambda same: fn(*same), impl.sync, warmup, count)
    kernels = None
    if impl.counts_kernels:
        new_inputs = prepare()
        kernels = impl.count_kernels(lambda: fn(*new_inputs))
    return fresh, reused, kernels


def timing_extra(fresh: Any, reused: Any) -> dict[str, Any]:
    return {"warmup_ms": [ms(t) for t in fresh.warmup], "run_ms": [ms(t) for t in fresh.runs],
            "reused_run_ms": [ms(t) for t in reused.runs]}


def matmul(impl: Any, n: int, data: Data, quick: bool) -> dict[str, Any]:
    arrays = [data[f"mm{n}_a"], data[f"mm{n}_b"]]
    fresh, reused, kernels = kernel_workload(impl, impl.matmul, arrays, 1,
                                             reps(impl, "matmul", quick))
    flops = 2 * n**3
    return {"metrics": {"gflops": flops / fresh.median / 1e9, "ms": ms(fresh.median),
                        "gflops_reused": flops / reused.median / 1e9, "kernels": kernels},
            "extra": timing_extra(fresh, reused)}


def fused(impl: Any, data: Data, quick: bool) -> dict[str, Any]:
    arrays = [data[f"fused_{name}"] for name in "abc"]
    fresh, reused, kernels = kernel_workload(impl, impl.fused, arrays, 1,
                                             reps(impl, "fused", quick))
    moved = 3 * FUSED_N * FUSED_N * 4 + FUSED_N * 4  # read a, b, c; write the row sums
    return {"metrics": {"gbps": moved / fresh.median / 1e9, "ms": ms(fresh.median),
                        "gbps_reused": moved / reused.median / 1e9, "kernels": kernels},
            "extra": {"bytes": moved, **timing_extra(fresh, reused)}}


def norm(impl: Any, name: str, data: Data, quick: bool) -> dict[str, Any]:
    fn = impl.softmax if name == "softmax" else impl.layernorm
    fresh, reused, kernels = kernel_workload(impl, fn, [data["norm_x"]], 1,
                                             reps(impl, "norm", quick))
    return {"metrics": {"ms": ms(fresh.median), "ms_reused": ms(reused.median),
                        "kernels": kernels},
            "extra": {"shape": list(NORM_SHAPE), **timing_extra(fresh, reused)}}


def tiny(impl: Any, data: Data, quick: bool) -> dict[str, Any]:
    """Launch cost of (x+1) on 16 floats: eagerly (a fresh graph per realize, each on its own
    input) and as a jitted one-kernel function; µs per call over a batch, one sync per batch."""
    x = data["tiny_x"]
    pool = lambda size: (lambda: [impl.tensor(x) for _ in range(size)])
    impl.sync(impl.add_one(impl.tensor(x)))  # compile outside the clock
    settle(impl)
    eager = time_batches(pool(reps(impl, "tiny_eager_batch", quick)), impl.add_one, impl.sync,
                         reps(impl, "tiny_eager", quick))
    same = impl.tensor(x)  # reused: one input for every call
    eager_reused = time_batches(lambda: [same] * reps(impl, "tiny_eager_batch", quick),
                                impl.add_one, impl.sync, reps(impl, "tiny_eager", quick))
    metrics: dict[str, Any] = {"eager_us": statistics.median(eager) * 1e6,
                               "eager_us_reused": statistics.median(eager_reused) * 1e6,
                               "jit_us": None, "jit_kernels": None}
    extra: dict[str, Any] = {"eager_us_runs": [t * 1e6 for t in eager],
                             "eager_us_reused_runs": [t * 1e6 for t in eager_reused]}
    if impl.has_jit:
        jitted = impl.jit_add_one()
        for _ in range(3):  # run, capture, first replay
            impl.sync(jitted(impl.tensor(x)))
        settle(impl)
        replay = time_batches(pool(reps(impl, "tiny_jit_batch", quick)), jitted, impl.sync,
                              reps(impl, "tiny_jit", quick))
        metrics["jit_us"] = statistics.median(replay) * 1e6
        extra["jit_us_runs"] = [t * 1e6 for t in replay]
        one = impl.tensor(x)
        metrics["jit_kernels"] = impl.count_kernels(lambda: jitted(one))
    return {"metrics": metrics, "extra": extra}


def deep(impl: Any, data: Data) -> dict[str, Any]:
    """Graph depth: build `x = x + 1` chained 10,000 and 100,000 times on a fresh input and
    realize it, once each (the 100,000 chain takes seconds). ms per 1,000 ops for both, and
    their ratio: 1.0 when the time grows linearly with the depth."""
    chain = getattr(impl, "deep_chain", None)
    if chain is None:
        raise NotImplementedError(f"{impl.name} runs eagerly: it builds no graph to be deep")
    x = data["deep_x"]
    # compile outside the clock: tinyteach cuts a deeper chain into kernels of 1,000 ops, all
    # alike, so the timed runs measure the graph work, which is what grows with depth
    impl.sync(chain(impl.tensor(x), 1000))
    metrics: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for length in DEEP_LENGTHS:
        start_tensor = impl.tensor(x)
        start = time.perf_counter()
        result = chain(start_tensor, length)
        impl.sync(result)
        seconds = time.perf_counter() - start
        metrics[f"ms_per_1k_{length // 1000}k"] = ms(seconds) / (length / 1000)
        extra[f"seconds_{length // 1000}k"] = seconds
        extra[f"max_error_{length // 1000}k"] = float(abs(result.numpy() - (x + length)).max())
    short, long = (f"ms_per_1k_{length // 1000}k" for length in DEEP_LENGTHS)
    metrics["linearity"] = metrics[long] / metrics[short]
    return {"metrics": metrics, "extra": extra}


def run_workload(framework: str, workload: str, data: Data, quick: bool,
                 first: bool) -> dict[str, Any]:
    """Measure one workload; a framework that cannot run it gets {"skipped": reason}."""
    try:
        impl = load_impl(framework)
        if workload in TRAIN_WORKLOADS:
            result = (train_first(impl, workload, data) if first
                      else train_steady(impl, workload, data, quick))
        elif workload.startswith("matmul"):
            result = matmul(impl, int(workload.removeprefix("matmul")), data, quick)
        elif workload == "fused":
            result = fused(impl, data, quick)
        elif workload in ("softmax", "layernorm"):
            result = norm(impl, workload, data, quick)
        elif workload == "tiny":
            result = tiny(impl, data, quick)
        elif workload == "deep":
            result = deep(impl, data)
        else:
            raise ValueError(f"unknown workload {workload!r}; choose from {WORKLOADS}")
    except NotImplementedError as error:
        return {"skipped": str(error)}
    result["notes"] = impl.notes
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("framework", choices=FRAMEWORKS)
    parser.add_argument("workload", choices=WORKLOADS)
    parser.add_argument("--data", type=Path, required=True, help="directory from data.save")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--first", action="store_true",
                        help="training workloads: time the first two steps of a fresh process")
    args = parser.parse_args(argv)
    try:
        result = run_workload(args.framework, args.workload, Data(args.data), args.quick,
                              args.first)
    except Exception as error:  # reported in the table, with the traceback on stderr
        traceback.print_exc()
        result = {"error": f"{type(error).__name__}: {error}"[:300]}
    result.update(framework=args.framework, workload=args.workload, pid=os.getpid())
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
