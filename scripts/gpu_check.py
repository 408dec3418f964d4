"""The one-shot GPU check (issue 14): `make gpu-check`, or `python3 scripts/gpu_check.py`.

Made for a machine with an NVIDIA GPU, no network and only the Python packages it already has
(numpy; PyTorch, pytest and tinygrad where installed): tinyteach is imported from this
checkout, nothing is installed. In one run of at most `--budget` seconds (default 300) it

1. probes the device (which CUDA binding, which GPU) and stops, saying why, if there is none;
2. runs the op suite on the device (the device-parametrized op tests, `pytest -k CUDA`);
3. trains an MLP on the 8x8 digits under TinyJit for a few steps (the loss must drop);
4. measures the memory bandwidth (a big device-to-device copy through PyTorch);
5. benchmarks tinyteach against PyTorch (and tinygrad when importable) on the same device:
   matmul float32 and half, the fused elementwise+reduce, softmax, layernorm, and an MLP and a
   CNN training step (the models and data of benchmarks/, same weights, same batches);

and writes `gpu_check.json` and `gpu_check.md` to `--out` (default gpu_check_out/) after each
step, so a failure or a hang in one part loses none of the others. Every part runs in a child
process with a time limit; a part that runs past it is stopped and reported as timed out.

    python3 scripts/gpu_check.py                         # CUDA, full sizes
    python3 scripts/gpu_check.py --device OPENCL --quick  # the same harness on pocl, tiny sizes

On a device other than CUDA the PyTorch peer runs on the CPU (its only other device here), so
its figures there are a smoke test of the harness, not a comparison of GPUs.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import queue
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

try:
    import numpy as np
except ImportError:  # said plainly by main(): nothing can run without numpy
    np = None  # type: ignore[assignment]

START, RESULT = "GPU_CHECK_START ", "GPU_CHECK_RESULT "
OP_SUITE = ["tests/test_ops.py", "tests/test_creation.py", "tests/test_indexing.py",
            "tests/test_dtypes.py"]
CUDA_TESTS = ["tests/test_cuda_runtime.py"]  # the runtime's own tests, real kernels on a GPU
QUICK_OPS = "add"  # a few of the op suite's tests in --quick
WORKLOADS = ("matmul_f32", "matmul_f16", "fused", "softmax", "layernorm", "mlp_step",
             "cnn_step")
FRAMEWORKS = ("tinyteach", "torch", "tinygrad")
TINYGRAD_DEVICE = {"CUDA": "CUDA", "OPENCL": "CL", "WEBGPU": "WEBGPU"}


@dataclass(frozen=True)
class Sizes:
    """Problem sizes and repetitions of one run (FULL on a GPU, QUICK to test the harness)."""

    matmul: int
    fused: int
    norm: tuple[int, int]
    train_steps: int  # TinyJit training run on the digits
    bench_warmup: int  # untimed steps of the MLP and CNN benchmarks (compile, JIT capture)
    bench_steps: int  # timed steps of the MLP and CNN benchmarks
    repeats: int  # timed runs of each kernel benchmark (after 1 warm-up run)
    copy_mb: int  # size of the bandwidth copy


FULL = Sizes(matmul=4096, fused=4096, norm=(4096, 1024), train_steps=60, bench_warmup=3,
             bench_steps=15, repeats=10, copy_mb=2048)
QUICK = Sizes(matmul=64, fused=256, norm=(64, 128), train_steps=12, bench_warmup=1,
              bench_steps=2, repeats=2, copy_mb=32)

# seconds each part may take (full run, --quick); a part never gets more than the budget left
LIMITS = {"probe": (90, 40), "ops": (110, 30), "train": (60, 40), "bandwidth": (30, 15),
          "bench": (45, 30)}


# ======================================================================================
# the child side: each part runs here, in a process of its own
# ======================================================================================

def torch_device(device: str) -> str:
    """PyTorch's name for the peer's device: the GPU for CUDA, else the CPU."""
    return "cuda" if device == "CUDA" else "cpu"


def git_commit() -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def package_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def probe(device: str) -> dict[str, Any]:
    """Can tinyteach run on `device` here? Which binding, which GPU; the peers' versions."""
    from tinyteach.device import Device
    reason = Device.why_unavailable(device)
    found: dict[str, Any] = {"ok": reason is None, "reason": reason, "device": device,
                             "python": platform.python_version(), "commit": git_commit(),
                             "numpy": np.__version__, "pytest": package_version("pytest"),
                             "tinygrad": package_version("tinygrad")}
    if reason is None:
        backend = Device[device]
        compiler = getattr(backend, "compiler", None)
        found["description"] = getattr(backend, "description", None) or \
            f"{device}: {getattr(compiler, 'cache_key', 'interpreter')}"
    return found


def training_data(seed: int = 0) -> tuple[np.ndarray, np.ndarray, str]:
    """The 8x8 digits (scikit-learn) as (1797, 64) floats and labels; where scikit-learn is
    missing, 10 Gaussian clusters in 64 dimensions (as learnable, and said so)."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        rng = np.random.default_rng(seed)
        centers = rng.standard_normal((10, 64)).astype(np.float32) * 2
        labels = rng.integers(0, 10, 1797).astype(np.int32)
        points = centers[labels] + rng.standard_normal((1797, 64)).astype(np.float32)
        return points, labels, "synthetic 10-class clusters (scikit-learn is not installed)"
    bunch = load_digits()
    return (bunch.data / 16.0).astype(np.float32), bunch.target.astype(np.int32), \
        "8x8 digits (scikit-learn)"


def train(device: str, sizes: Sizes) -> dict[str, Any]:
    """An MLP 64-64-10 trained with Adam under TinyJit, batch 128, on `device`."""
    from tinyteach import Context, Device, Tensor, TinyJit, nn
    from tinyteach.nn.optim import Adam
    Device.DEFAULT = device
    points, labels, source = training_data()
    rng = np.random.default_rng(0)
    batches = [rng.choice(1500, 128, replace=False) for _ in range(8)]
    l1, l2 = nn.Linear(64, 64), nn.Linear(64, 10)
    opt = Adam([l1.weight, l1.bias, l2.weight, l2.bias], lr=1e-2)

    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
        with Context(TRAINING=1):
            opt.zero_grad()
            loss = l2(l1(x).relu()).sparse_categorical_crossentropy(y).backward()
            Tensor.realize(loss, *opt.schedule_step())
        return loss

    losses, times = [], []
    for i in range(sizes.train_steps):
        order = batches[i % len(batches)]
        x, y = Tensor(points[order]).realize(), Tensor(labels[order]).realize()
        start = time.perf_counter()
        losses.append(float(step(x, y).item()))
        times.append(time.perf_counter() - start)
    test = Tensor(points[1500:])
    predicted = l2(l1(test).relu()).argmax(axis=1).numpy()
    first, last = statistics.mean(losses[:3]), statistics.mean(losses[-3:])
    captured = getattr(step, "captured", None)
    return {"ok": last < 0.7 * first, "data": source, "steps": sizes.train_steps,
            "first_loss": first, "last_loss": last, "losses": losses,
            "ms_step": statistics.median(times[3:]) * 1e3 if len(times) > 3 else None,
            "test_accuracy": float((predicted == labels[1500:]).mean()),
            "jit_kernels": len(captured.launches) if captured is not None else None}


def bandwidth(device: str, sizes: Sizes) -> dict[str, Any]:
    """GB/s of a big device-to-device copy through PyTorch (bytes read + bytes written)."""
    import torch
    where = torch_device(device)
    sync = torch.cuda.synchronize if where == "cuda" else (lambda: None)
    nbytes = sizes.copy_mb << 20
    src = torch.empty(nbytes, dtype=torch.uint8, device=where).fill_(1)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync()
    repeats = 20
    start = time.perf_counter()
    for _ in range(repeats):
        dst.copy_(src)
    sync()
    seconds = (time.perf_counter() - start) / repeats
    name = torch.cuda.get_device_name(0) if where == "cuda" else "cpu"
    return {"gbps": 2 * nbytes / seconds / 1e9, "bytes": nbytes, "ms": seconds * 1e3,
            "peer": f"torch {torch.__version__} on {where} ({name})"}


class TorchPeer:
    """PyTorch on the GPU (or on the CPU for the other devices): benchmarks/impl_torch.py's
    workloads, with tensors and models moved to the device and a synchronize after each."""

    has_jit = False
    counts_kernels = False

    def __init__(self, device: str):
        import torch

        from benchmarks.impl_torch import TorchImpl
        self.torch, self.where = torch, torch_device(device)
        self.base = TorchImpl()
        self.notes = [f"torch {torch.__version__} on {self.where}, eager"]

    def tensor(self, array: np.ndarray) -> Any:
        return self.torch.from_numpy(array.copy()).to(self.where)

    def sync(self, _: Any = None) -> None:
        if self.where == "cuda":
            self.torch.cuda.synchronize()

    def __getattr__(self, name: str) -> Any:  # matmul, fused, softmax, layernorm
        if name == "base":  # not set yet: no recursion
            raise AttributeError(name)
        return getattr(self.base, name)

    def train_step(self, kind: str, data: Any) -> Any:
        import torch.nn.functional as F
        model = (self.base._mlp(data) if kind == "mlp" else self.base._cnn(data)).to(self.where)
        opt = self.torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
        xs = [self.tensor(x) for x in data[f"{kind}_x"]]
        ys = [self.tensor(y.astype(np.int64)) for y in data[f"{kind}_y"]]

        def step(i: int) -> float:
            opt.zero_grad()
            loss = F.cross_entropy(model(xs[i % len(xs)]), ys[i % len(ys)])
            loss.backward()
            opt.step()
            return float(loss.item())
        return step


def make_impl(framework: str, device: str) -> Any:
    """The benchmark implementation; NotImplementedError (reported as skipped) where the
    framework is not installed or cannot run on the device."""
    if framework == "torch":
        try:
            return TorchPeer(device)
        except ImportError as error:
            raise NotImplementedError(f"torch is not installed ({error})") from error
    from benchmarks.impl_tiny import TinyImpl
    if framework == "tinygrad":
        if importlib.util.find_spec("tinygrad") is None:
            raise NotImplementedError("tinygrad is not installed")
        return TinyImpl("tinygrad", device=TINYGRAD_DEVICE.get(device, device))
    return TinyImpl("tinyteach", device=device)


def to_numpy(value: Any) -> np.ndarray:
    if type(value).__module__.startswith("torch"):
        return value.detach().float().cpu().numpy()
    return np.asarray(value.numpy(), dtype=np.float32)


def kernel_inputs(workload: str, sizes: Sizes) -> tuple[list[np.ndarray], float, str]:
    """A kernel workload's inputs, its work (FLOPs for matmuls, else bytes moved) and unit."""
    rng = np.random.default_rng([0, WORKLOADS.index(workload)])
    if workload.startswith("matmul"):
        n = sizes.matmul
        dtype = np.float16 if workload == "matmul_f16" else np.float32
        arrays = [rng.standard_normal((n, n), dtype=np.float32).astype(dtype) for _ in "ab"]
        return arrays, 2.0 * n**3, "flops"
    if workload == "fused":
        n = sizes.fused
        arrays = [rng.standard_normal((n, n), dtype=np.float32) for _ in "abc"]
        return arrays, 3.0 * n * n * 4 + n * 4, "bytes"  # read a, b, c; write the row sums
    rows, cols = sizes.norm
    return [rng.standard_normal((rows, cols), dtype=np.float32)], 2.0 * rows * cols * 4, "bytes"


def reference(workload: str, arrays: list[np.ndarray]) -> np.ndarray:
    """numpy's answer (float32, from the same inputs) for the correctness column."""
    values = [a.astype(np.float32) for a in arrays]
    if workload.startswith("matmul"):
        return values[0] @ values[1]
    if workload == "fused":
        a, b, c = values
        return np.maximum((a + b) * c, 0).sum(1)
    x = values[0]
    if workload == "softmax":
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / max(float(np.linalg.norm(want)), 1e-30))


def bench_kernel(impl: Any, workload: str, sizes: Sizes) -> dict[str, Any]:
    from benchmarks.worker import kernel_workload
    arrays, work, unit = kernel_inputs(workload, sizes)
    fn = impl.matmul if workload.startswith("matmul") else getattr(impl, workload)
    timings, reused, kernels = kernel_workload(impl, fn, arrays, 1, sizes.repeats)
    seconds = timings.median
    error = relative_error(to_numpy(fn(*[impl.tensor(a) for a in arrays])),
                           reference(workload, arrays))
    tolerance = 1e-2 if workload == "matmul_f16" else 1e-4
    result = {"ms": seconds * 1e3, "kernels": kernels, "rel_error": error,
              "correct": error < tolerance, "run_ms": [t * 1e3 for t in timings.runs],
              "reused_ms": reused.median * 1e3}
    if unit == "flops":
        result["tflops"] = work / seconds / 1e12
    else:
        result["gbps"] = work / seconds / 1e9
    return result


def bench_train(impl: Any, workload: str, sizes: Sizes, data_dir: Path) -> dict[str, Any]:
    from benchmarks import data
    kind = workload.removesuffix("_step")
    if not (data_dir / f"{kind}_x.npy").exists():
        data.save(data_dir, [kind])
    step = impl.train_step(kind, data.Data(data_dir))
    losses, times = [], []
    for i in range(sizes.bench_warmup + sizes.bench_steps):
        start = time.perf_counter()
        losses.append(step(i))
        times.append(time.perf_counter() - start)
    return {"ms": statistics.median(times[sizes.bench_warmup:]) * 1e3, "losses": losses,
            "run_ms": [t * 1e3 for t in times]}


def bench(framework: str, workload: str, device: str, sizes: Sizes,
          data_dir: Path) -> dict[str, Any]:
    impl = make_impl(framework, device)
    if workload.endswith("_step"):
        result = bench_train(impl, workload, sizes, data_dir)
    else:
        result = bench_kernel(impl, workload, sizes)
    result["notes"] = list(getattr(impl, "notes", []))
    return result


def run_task(task: str, args: argparse.Namespace) -> dict[str, Any]:
    sizes = QUICK if args.quick else FULL
    if task == "probe":
        return probe(args.device)
    if task == "train":
        return train(args.device, sizes)
    if task == "bandwidth":
        return bandwidth(args.device, sizes)
    _, framework, workload = task.split(":")
    return bench(framework, workload, args.device, sizes, args.out / "data")


def child_main(args: argparse.Namespace) -> int:
    """Run each task in turn; before each print START, after it RESULT with its JSON."""
    for task in args.tasks.split(","):
        print(START + task, flush=True)
        start = time.perf_counter()
        try:
            result = run_task(task, args)
        except NotImplementedError as error:
            result = {"skipped": str(error)}
        except Exception as error:
            traceback.print_exc()
            result = {"error": f"{type(error).__name__}: {error}"[:400]}
        result["seconds"] = time.perf_counter() - start
        print(RESULT + json.dumps({"task": task, **result}, default=str), flush=True)
    return 0


# ======================================================================================
# the parent side: run the parts with time limits, write the report after each
# ======================================================================================

class Budget:
    """The seconds the whole run may take; each part gets its own limit or what is left."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def limit(self, wanted: float) -> float:
        return max(0.0, min(wanted, self.end - time.monotonic() - 2))


def _read_lines(stream: Any, lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def _stop(process: subprocess.Popen[str]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()


def run_tasks(tasks: list[str], args: argparse.Namespace, budget: Budget, limit: float,
              record: Any) -> None:
    """Run `tasks` in a child process, each within `limit` seconds (and the budget); a task
    that hangs or crashes is recorded as such and the child restarted for the rest."""
    pending = list(tasks)
    log_path = args.out / "logs" / f"{tasks[0].replace(':', '_')}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    while pending:
        if budget.limit(limit) < 3:
            for task in pending:
                record(task, {"skipped": "out of time: the run's budget was spent"})
            return
        command = [sys.executable, str(Path(__file__).resolve()), "--child", "--tasks",
                   ",".join(pending), "--device", args.device, "--out", str(args.out)] + \
            (["--quick"] if args.quick else [])
        with open(log_path, "a") as log:
            process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=log,
                                       text=True, start_new_session=True)
            assert process.stdout is not None
            lines: queue.Queue[str | None] = queue.Queue()
            threading.Thread(target=_read_lines, args=(process.stdout, lines),
                             daemon=True).start()
            current, deadline = None, time.monotonic() + budget.limit(limit)
            while True:
                try:
                    line = lines.get(timeout=max(deadline - time.monotonic(), 0.01))
                except queue.Empty:  # the current task ran past its limit
                    _stop(process)
                    task = current or pending[0]
                    record(task, {"error": f"timed out after {budget.limit(limit):.0f} s "
                                           "(stopped)"})
                    pending.remove(task)
                    break
                if line is None:  # the child ended
                    process.wait()
                    if current is not None:  # it died inside a task
                        record(current, {"error": f"the process died (exit "
                                                  f"{process.returncode}); see {log_path}"})
                        pending.remove(current)
                    elif pending:  # it died before starting one
                        for task in pending:
                            record(task, {"error": f"the process failed to start (exit "
                                                   f"{process.returncode}); see {log_path}"})
                        pending.clear()
                    break
                if line.startswith(START):
                    current = line[len(START):].strip()
                    deadline = time.monotonic() + budget.limit(limit)
                elif line.startswith(RESULT):
                    result = json.loads(line[len(RESULT):])
                    task = result.pop("task")
                    record(task, result)
                    pending.remove(task)
                    current = None


_TEST_LINE = re.compile(r"(tests/\S+::\S+) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)|"
                        r"(PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS) (tests/\S+::\S+)")


def pytest_outcomes(text: str) -> dict[str, str]:
    """test id -> outcome, from pytest -v lines (with or without pytest-xdist)."""
    outcomes = {}
    for match in _TEST_LINE.finditer(text):
        test = match.group(1) or match.group(4)
        outcomes[test] = match.group(2) or match.group(3)
    return outcomes


def pytest_command(args: argparse.Namespace, files: list[str]) -> list[str]:
    keyword = f"{args.device} and ({QUICK_OPS})" if args.quick else args.device
    # -o addopts=: the project's "-q" would hide the per-test lines run_ops reads
    return [sys.executable, "-m", "pytest", "-o", "addopts=", "-v", "-p", "no:cacheprovider",
            "-k", keyword, *files]


def run_ops(args: argparse.Namespace, limit: float) -> dict[str, Any]:
    """The op suite on the device, via pytest, within `limit` seconds: one pytest process per
    test file, all at once (the GPU machine has the cores; pytest-xdist may be missing)."""
    if importlib.util.find_spec("pytest") is None:
        return {"skipped": "pytest is not installed"}
    if limit < 3:
        return {"skipped": "out of time: the run's budget was spent"}
    files = OP_SUITE[:1] if args.quick else OP_SUITE + (CUDA_TESTS if args.device == "CUDA"
                                                         else [])
    # no other plugins (notebook, hypothesis, ...): the op suite needs none, and they are slow
    env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    # one device's tests run here: a CI's demand that every device ran (tests/conftest.py)
    # would fail this run although each of its tests passed
    env.pop("TINYTEACH_REQUIRE_DEVICES", None)
    (args.out / "logs").mkdir(parents=True, exist_ok=True)
    start, deadline = time.monotonic(), time.monotonic() + limit
    runs = []
    for file in files:
        log_path = args.out / "logs" / f"ops_{Path(file).stem}.log"
        with open(log_path, "w") as log:
            process = subprocess.Popen(pytest_command(args, [file]), cwd=ROOT, stdout=log,
                                       stderr=subprocess.STDOUT, text=True,
                                       start_new_session=True, env=env)
        runs.append((process, log_path))
    timed_out = False
    for process, _ in runs:
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            _stop(process)
            timed_out = True
    outcomes: dict[str, str] = {}
    for _, log_path in runs:
        outcomes.update(pytest_outcomes(log_path.read_text(errors="replace")))
    counts = {kind.lower(): sum(1 for o in outcomes.values() if o == kind)
              for kind in ("PASSED", "FAILED", "SKIPPED", "ERROR")}
    failed = [t for t, o in outcomes.items() if o in ("FAILED", "ERROR")]
    exit_codes = [process.returncode for process, _ in runs]
    status = "timed out" if timed_out else (
        "passed" if all(code == 0 for code in exit_codes) and counts["passed"] else "failed")
    return {"status": status, **counts, "failures": failed[:30], "exit_codes": exit_codes,
            "seconds": time.monotonic() - start, "limit_s": limit,
            "command": " ".join(pytest_command(args, files)),
            "logs": [str(log_path) for _, log_path in runs]}


# ---- the report ----

def fmt(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def figure(workload: str, result: dict[str, Any] | None) -> str:
    """One cell of the benchmark table: the throughput and the time, or why there is none."""
    if not result:
        return "not run"
    if "skipped" in result:
        return "n/a"
    if "error" in result:
        return "error"
    if "tflops" in result:
        return f"{result['tflops']:.3g} TFLOP/s ({result['ms']:.3g} ms)"
    if "gbps" in result:
        return f"{result['gbps']:.3g} GB/s ({result['ms']:.3g} ms)"
    return f"{result['ms']:.3g} ms/step"


def speed(results: dict[str, Any], peer: str) -> float | None:
    """tinyteach's speed relative to `peer`: peer time / tinyteach time (1.0 = as fast)."""
    tt, other = results.get("tinyteach") or {}, results.get(peer) or {}
    if "ms" not in tt or "ms" not in other or not tt["ms"]:
        return None
    return float(other["ms"]) / float(tt["ms"])


def goals(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 14's goals, each with its measured value (None where it could not be measured)."""
    bench_results = report["benchmarks"]
    half = speed(bench_results.get("matmul_f16", {}), "torch")
    fused = (bench_results.get("fused", {}).get("tinyteach") or {}).get("gbps")
    copy = (report.get("bandwidth") or {}).get("gbps")
    share = fused / copy if fused and copy else None
    vs_tinygrad = [speed(bench_results.get(w, {}), "tinygrad") for w in WORKLOADS]
    measured = [v for v in vs_tinygrad if v is not None]
    slowest = min(measured) if measured else None
    return [
        {"goal": "half matmul at >= 50% of PyTorch's speed", "value": half,
         "met": None if half is None else half >= 0.5},
        {"goal": "fused elementwise+reduce at >= 70% of the measured bandwidth", "value": share,
         "met": None if share is None else share >= 0.7},
        {"goal": "every workload at least as fast as tinygrad (slowest ratio)", "value": slowest,
         "met": None if slowest is None else slowest >= 1.0},
    ]


def markdown(report: dict[str, Any]) -> str:
    meta, probe_result = report["meta"], report.get("probe") or {}
    lines = [f"# tinyteach GPU check: {probe_result.get('description') or meta['device']}", "",
             f"{meta['started']}, python {probe_result.get('python', '?')}, "
             f"tinygrad {probe_result.get('tinygrad') or 'not installed'}, commit "
             f"{probe_result.get('commit') or '?'}; {'--quick, ' if meta['quick'] else ''}"
             f"{meta['seconds']:.0f} s of a {meta['budget_s']:.0f} s budget.", ""]
    ops = report.get("ops") or {}
    lines += ["## Op suite", ""]
    if "status" in ops:
        lines.append(f"{ops['status']}: {ops['passed']} passed, {ops['failed']} failed, "
                     f"{ops['error']} errors, {ops['skipped']} skipped in {ops['seconds']:.0f} s "
                     f"(limit {ops['limit_s']:.0f} s; `{ops['command']}`, one process per "
                     "file)")
        lines += [f"- failed: `{name}`" for name in ops["failures"]]
    else:
        lines.append(ops.get("skipped") or ops.get("error") or "not run")
    trained = report.get("train") or {}
    lines += ["", "## TinyJit training (MLP 64-64-10, Adam, batch 128)", ""]
    if "first_loss" in trained:
        lines += ["| data | steps | first loss | last loss | loss dropped | ms/step | "
                  "test accuracy | kernels per step |", "|---|---|---|---|---|---|---|---|",
                  f"| {trained['data']} | {trained['steps']} | {trained['first_loss']:.3f} | "
                  f"{trained['last_loss']:.3f} | {'yes' if trained['ok'] else 'NO'} | "
                  f"{fmt(trained['ms_step'])} | {trained['test_accuracy']:.1%} | "
                  f"{trained['jit_kernels']} |"]
    else:
        lines.append(trained.get("error") or trained.get("skipped") or "not run")
    copy = report.get("bandwidth") or {}
    lines += ["", "## Memory bandwidth", ""]
    lines.append(f"{copy['gbps']:.0f} GB/s: {copy['peer']}, a {copy['bytes'] >> 20} MiB copy "
                 f"(bytes read + written per second)" if "gbps" in copy
                 else copy.get("error") or copy.get("skipped") or "not run")
    lines += ["", "## Benchmarks", "",
              "speed = peer time / tinyteach time (1.0: as fast; above: faster). correct: "
              "tinyteach's result against numpy (relative error).", "",
              "| workload | tinyteach | torch | tinygrad | speed vs torch | speed vs tinygrad "
              "| correct |", "|---|---|---|---|---|---|---|"]
    for workload in WORKLOADS:
        results = report["benchmarks"].get(workload, {})
        tt = results.get("tinyteach") or {}
        correct = ("n/a" if "correct" not in tt else
                   f"{'yes' if tt['correct'] else 'NO'} ({tt['rel_error']:.1e})")
        cells = [figure(workload, results.get(f)) for f in FRAMEWORKS]
        lines.append(f"| {workload} | {' | '.join(cells)} | {fmt(speed(results, 'torch'))} | "
                     f"{fmt(speed(results, 'tinygrad'))} | {correct} |")
    fused = (report["benchmarks"].get("fused", {}).get("tinyteach") or {}).get("gbps")
    if fused and copy.get("gbps"):
        lines += ["", f"fused: {fused:.3g} GB/s = {fused / copy['gbps']:.0%} of the measured "
                  "bandwidth"]
    problems = [f"- {workload} / {framework}: {result.get('error') or result.get('skipped')}"
                for workload, by_framework in report["benchmarks"].items()
                for framework, result in by_framework.items()
                if "error" in result or "skipped" in result]
    if problems:
        lines += ["", "not measured:", *problems]
    lines += ["", "## Goals (issue 14)", "", "| goal | value | met |", "|---|---|---|"]
    for goal in report["goals"]:
        met = {True: "yes", False: "no", None: "n/a"}[goal["met"]]
        lines.append(f"| {goal['goal']} | {fmt(goal['value'])} | {met} |")
    if meta["device"] != "CUDA":
        lines += ["", f"On {meta['device']} the torch peer runs on the CPU: these figures test "
                  "the harness; they are not GPU timings."]
    return "\n".join(lines) + "\n"


def save(report: dict[str, Any], out: Path, started: float) -> None:
    report["meta"]["seconds"] = time.monotonic() - started
    report["goals"] = goals(report)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "gpu_check.md").write_text(markdown(report))


def parent_main(args: argparse.Namespace) -> int:
    started = time.monotonic()
    if np is None:
        print(f"no {args.device} device: numpy is not installed for {sys.executable}")
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    if args.out.is_relative_to(ROOT):  # keep the results out of git
        (args.out / ".gitignore").write_text("*\n")
    budget = Budget(args.budget)
    limit = {name: values[1 if args.quick else 0] for name, values in LIMITS.items()}
    report: dict[str, Any] = {
        "meta": {"device": args.device, "quick": args.quick, "budget_s": args.budget,
                 "started": time.strftime("%Y-%m-%d %H:%M:%S"), "seconds": 0.0,
                 "machine": platform.machine(), "cores": os.cpu_count(),
                 "sizes": asdict(QUICK if args.quick else FULL)},
        "probe": None, "ops": None, "train": None, "bandwidth": None,
        "benchmarks": {workload: {} for workload in WORKLOADS}, "goals": []}

    def record(task: str, result: dict[str, Any]) -> None:
        if task.startswith("bench:"):
            _, framework, workload = task.split(":")
            report["benchmarks"][workload][framework] = result
        else:
            report[task] = result
        save(report, args.out, started)
        summary = result.get("error") or result.get("skipped") or "done"
        print(f"  {task:<28} {summary}", flush=True)

    print(f"==> GPU check on {args.device} (budget {args.budget:.0f} s), writing {args.out}/")
    run_tasks(["probe"], args, budget, limit["probe"], record)
    found = report["probe"] or {}
    if not found.get("ok"):
        reason = found.get("reason") or found.get("error") or "the probe failed"
        prefix = f"no {args.device} device"
        print(reason if str(reason).startswith(prefix) else f"{prefix}: {reason}")
        return 1
    print(f"  {found.get('description')}")
    report["ops"] = run_ops(args, budget.limit(limit["ops"]))
    record("ops", report["ops"])
    run_tasks(["train"], args, budget, limit["train"], record)
    run_tasks(["bandwidth"], args, budget, limit["bandwidth"], record)
    for framework in FRAMEWORKS:
        run_tasks([f"bench:{framework}:{w}" for w in args.workloads], args, budget,
                  limit["bench"], record)
    save(report, args.out, started)
    print(f"==> wrote {args.out / 'gpu_check.json'} and {args.out / 'gpu_check.md'} "
          f"({report['meta']['seconds']:.0f} s)")
    print(markdown(report))
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="CUDA", type=str.upper,
                        help="the device to check (default CUDA; OPENCL or WEBGPU to test "
                             "the harness without a GPU)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, few repetitions")
    parser.add_argument("--out", type=Path, default=ROOT / "gpu_check_out",
                        help="folder for gpu_check.json, gpu_check.md and logs/")
    parser.add_argument("--budget", type=float, default=300.0,
                        help="seconds the whole run may take (default 300)")
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS),
                        help="the benchmarks to run (default: all)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tasks", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.out = args.out.resolve()
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="xdg-"))
        return child_main(args)
    return parent_main(args)


if __name__ == "__main__":
    sys.exit(main())
