"""Chapter 9: the CPU device's tiered compilation (runtime/cpu.py) — a schedule's new kernels
start on a fast tier (tcc, or cc -O0 without it) while cc -O2 builds them in the background,
then each program swaps in the optimized build.

The tiers must give the same bits: every special-value kernel (NaN, ±inf, -0.0, subnormals,
int32 limits, casts, integer division by zero) runs on each fast tier and on the optimized
build, and the outputs are compared byte for byte; the optimized results themselves are checked
against numpy. Kernels whose optimized build may reorder arithmetic skip the fast tier."""
from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import tinyteach.runtime.cpu as cpu
from tinyteach import Context, Tensor, TinyJit, dtypes
from tinyteach.device import Buffer, CompileError, Device
from tinyteach.engine.realize import Launch, record_launches

NAN, INF = float("nan"), float("inf")
FLOATS = np.array([NAN, INF, -INF, -0.0, 0.0, 1e-40, -1e-40, float(np.finfo(np.float32).tiny),
                   3e38, -3e38, 1.5, -2.5, 0.1, 7.0, -1e-45, 2.0**-126], dtype=np.float32)
INT32 = np.iinfo(np.int32)
INTS = np.array([INT32.min, INT32.max, INT32.min + 1, -7, -1, 0, 1, 7, 3, -3, 2, 100, -100,
                 INT32.max - 1, 5, -5], dtype=np.int32)

# name -> (kernel built from tensors a, b (float32) and i, j (int32), numpy's answer)
Case = tuple[Callable[..., Tensor], Callable[..., np.ndarray]]
CASES: dict[str, Case] = {
    "add": (lambda a, b, i, j: a + b, lambda a, b, i, j: a + b),
    "sub": (lambda a, b, i, j: a - b, lambda a, b, i, j: a - b),
    "mul": (lambda a, b, i, j: a * b, lambda a, b, i, j: a * b),
    "div": (lambda a, b, i, j: a / b, None),  # a * (1/b), as tinygrad: not numpy's a / b
    "maximum": (lambda a, b, i, j: a.maximum(b), None),
    "neg_and_add_zero": (lambda a, b, i, j: -a + 0.0, lambda a, b, i, j: -a + np.float32(0.0)),
    "sqrt": (lambda a, b, i, j: a.sqrt(), lambda a, b, i, j: np.sqrt(a)),
    "exp2": (lambda a, b, i, j: a.exp2(), lambda a, b, i, j: np.exp2(a)),
    "log2": (lambda a, b, i, j: a.log2(), lambda a, b, i, j: np.log2(a)),
    "sin": (lambda a, b, i, j: a.sin(), lambda a, b, i, j: np.sin(a)),
    "reciprocal": (lambda a, b, i, j: a.reciprocal(), lambda a, b, i, j: 1 / a),
    "compare_where": (lambda a, b, i, j: (a < b).where(a, b), lambda a, b, i, j:
                      np.where(a < b, a, b)),
    "not_equal": (lambda a, b, i, j: (a != b).cast(dtypes.float32), lambda a, b, i, j:
                  (a != b).astype(np.float32)),
    "relu_abs": (lambda a, b, i, j: a.relu() + b.abs(), None),
    # (NaN converts to 0: tests/test_cast_saturation.py; numpy's astype leaves it undefined)
    "float_to_int": (lambda a, b, i, j: (a * 1e3).clip(-1e9, 1e9).cast(dtypes.int32),
                     lambda a, b, i, j: np.nan_to_num(np.clip(a * np.float32(1e3), -1e9, 1e9),
                                                      nan=0.0).astype(np.int32)),
    "int_to_float": (lambda a, b, i, j: i.cast(dtypes.float32) * 0.5, lambda a, b, i, j:
                     i.astype(np.float32) * np.float32(0.5)),
    "uint_to_float": (lambda a, b, i, j: i.cast(dtypes.uint32).cast(dtypes.float32), lambda a, b,
                      i, j: i.astype(np.uint32).astype(np.float32)),
    "int64_to_double": (lambda a, b, i, j: (i.cast(dtypes.int64) * 3037000499)
                        .cast(dtypes.float64), lambda a, b, i, j:
                        (i.astype(np.int64) * 3037000499).astype(np.float64)),
    "float_to_double": (lambda a, b, i, j: a.cast(dtypes.float64) * 3.0, lambda a, b, i, j:
                        a.astype(np.float64) * 3.0),
    "int_divide_by_zero": (lambda a, b, i, j: i // j, None),
    "int_modulo_by_zero": (lambda a, b, i, j: i % j, None),
    "int_wraparound": (lambda a, b, i, j: i * j + i, lambda a, b, i, j: i * j + i),
    "bitwise": (lambda a, b, i, j: (i ^ j) | (i & 12), lambda a, b, i, j: (i ^ j) | (i & 12)),
}


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TINYTEACH_CACHE", str(tmp_path))
    return tmp_path / "cpu"


def compiler() -> cpu.ClangStyleCompiler:
    backend_compiler = Device["CPU"].compiler
    assert isinstance(backend_compiler, cpu.ClangStyleCompiler)
    return backend_compiler


def fast_tiers() -> list[str]:
    """Every fast tier this machine has: cc -O0 always, tcc where it is installed."""
    fast = compiler().fast
    return [fast.unoptimized_name] + (["tcc"] if fast.tcc else [])


def inputs() -> list[Tensor]:
    """Every value against every other (a 16x16 grid of pairs), as tensors on the CPU."""
    a, b = np.meshgrid(FLOATS, FLOATS, indexing="ij")
    i, j = np.meshgrid(INTS, INTS, indexing="ij")
    return [Tensor(x.copy(), device="CPU").realize() for x in (a, b, i, j)]


def launches_of(case: Case, given: list[Tensor] | None = None) -> tuple[list[Launch], Tensor]:
    """The kernels of one case, built optimized (tiering off), and the result tensor."""
    build, _ = case
    with Context(CPU_TIERED=0), record_launches() as launches:
        result = build(*(inputs() if given is None else given)).realize()
    kernels = [launch for launch in launches if launch.runner is not None]
    assert kernels
    return kernels, result


def run_on_tier(launch: Launch, tier: str) -> np.ndarray | None:
    """The output bytes of `launch`'s kernel built by `tier`, on the same inputs (None: that
    tier cannot build this source, e.g. tcc and vector types)."""
    runner = launch.runner
    assert runner is not None and runner.source is not None
    fast = compiler().fast
    if tier == "tcc" and fast.tier_for(runner.source) != "tcc":
        return None
    library = fast.build(runner.source, tier)
    assert library is not None, f"{tier} failed to build {runner.name}"
    output = launch.buffers[0]
    fresh = Buffer("CPU", output.size, output.dtype)
    cpu.CPUProgram(runner.name, library)(fresh, *launch.buffers[1:])
    return fresh.numpy().view(np.uint8)


@pytest.mark.parametrize("name", sorted(CASES))
def test_special_values_are_bitwise_equal_on_every_tier(name: str) -> None:
    kernels, result = launches_of(CASES[name])
    reference = CASES[name][1]
    if reference is not None:  # the optimized build is right (NaN in place, values exact)
        arrays = [t.numpy() for t in inputs()]
        with np.errstate(all="ignore"):
            expected = reference(*arrays)
        ours, theirs = result.numpy(), expected.astype(result.numpy().dtype)
        if theirs.dtype.kind == "f":  # NaN in the same places; sin is tinyteach's own series
            np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=0, equal_nan=True)
        else:
            np.testing.assert_array_equal(ours, theirs)
    compared = 0
    for launch in kernels:
        assert launch.runner is not None and launch.runner.source is not None
        if cpu.needs_optimized_build(launch.runner.source):
            continue  # never tiered
        optimized = launch.buffers[0].numpy().view(np.uint8)
        for tier in fast_tiers():
            on_tier = run_on_tier(launch, tier)
            if on_tier is not None:
                assert on_tier.tobytes() == optimized.tobytes(), f"{name} differs on {tier}"
                compared += 1
    assert compared > 0, f"no kernel of {name} could be tiered"


# 64-bit integers that a conversion through double would round twice (2^60 + 2^36 + 1 becomes
# 2^60 + 2^36 in double, then a tie that float32 rounds to even: 2^60; rounded once: 2^60 + 2^37)
INT64S = np.array([2**60 + 2**36 + 1, -(2**60 + 2**36 + 1), 2**63 - 1, -2**63, 2**53 + 1,
                   2**24 + 1, -(2**24 + 1), 0, -1, 2**62 + 2**38 + 1], dtype=np.int64)
UINT64S = np.array([2**64 - 1, 2**63 + 2**39 + 1, 2**63, 2**53 + 1, 2**63 + 2**11 + 1, 0, 1,
                    2**32 + 1, 2**60 + 2**36 + 1, 2**64 - 2**40 - 1], dtype=np.uint64)


@pytest.mark.parametrize("values", [INT64S, UINT64S], ids=["int64", "uint64"])
@pytest.mark.parametrize("target", [dtypes.float32, dtypes.float64], ids=["float", "double"])
def test_64_bit_integers_convert_alike_on_every_tier(values: np.ndarray, target) -> None:
    case: Case = (lambda x: (x + 0).cast(target), None)
    kernels, result = launches_of(case, [Tensor(values.copy(), device="CPU").realize()])
    np.testing.assert_array_equal(result.numpy(), values.astype(target.np))  # rounded once
    for launch in kernels:
        optimized = launch.buffers[0].numpy().view(np.uint8)
        for tier in fast_tiers():
            on_tier = run_on_tier(launch, tier)
            if on_tier is not None:
                assert on_tier.tobytes() == optimized.tobytes(), f"differs on {tier}"


def test_reordering_kernels_skip_the_fast_tier() -> None:
    """A source under `omp simd` or fp-contract (its optimized build may reorder or fuse) is
    never tiered. A matmul's vector multiply-adds are explicit fused multiply-adds now
    (tests/test_fma_tiers.py): it is tiered, as elementwise kernels are."""
    a = Tensor(np.ones((16, 16), dtype=np.float32), device="CPU").realize()
    with Context(CPU_TIERED=0), record_launches() as launches:
        Tensor.realize(a @ a, a * 2.5)
    sources = {launch.runner.source for launch in launches if launch.runner is not None}
    assert sources and not any(cpu.needs_optimized_build(s) for s in sources if s)
    assert not cpu.needs_optimized_build("void f(float* restrict d) { d[0] = 1.0f; }")
    assert cpu.needs_optimized_build("#pragma omp simd reduction(+:acc0)")
    assert cpu.needs_optimized_build('__attribute__((optimize("fp-contract=fast")))')


def unique_kernels(count: int) -> list[str]:
    """`count` elementwise kernels and one reduction under omp simd, unknown to any cache."""
    tag = uuid.uuid4().hex[:8]
    sources = [f"void k{tag}_{n}(float* restrict data0, const float* restrict data1) {{\n"
               f"  for (int i = 0; i < 4; i++) {{ data0[i] = data1[i] * {n + 2}.0f; }}\n}}\n"
               for n in range(count)]
    sources.append(f"void k{tag}_sum(float* restrict data0, const float* restrict data1) {{\n"
                   "  float acc0 = 0.0f;\n  #pragma omp simd reduction(+:acc0)\n"
                   "  for (int i = 0; i < 4; i++) { acc0 = acc0 + data1[i]; }\n"
                   "  data0[0] = acc0;\n}\n")
    return sources


def run_kernel(program: cpu.CPUProgram) -> list[float]:
    out, inp = Buffer("CPU", 4, dtypes.float32), Buffer("CPU", 4, dtypes.float32)
    inp.copyin(np.array([1, 2, 3, 4], dtype=np.float32))
    program(out, inp)
    return out.numpy().tolist()


def function_name(source: str) -> str:
    return source.split("void ", 1)[1].split("(", 1)[0]


def test_compile_many_starts_fast_then_swaps_in_the_optimized_build(
        cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # hold the background build until the fast tier has been checked: on an idle machine the
    # optimized build can finish before the programs below are even made
    release = threading.Event()
    optimize = cpu.ClangStyleCompiler._optimize

    def held(self: cpu.ClangStyleCompiler, queued: list) -> None:
        release.wait(timeout=120)
        optimize(self, queued)
    monkeypatch.setattr(cpu.ClangStyleCompiler, "_optimize", held)
    sources = unique_kernels(3)
    binaries = compiler().compile_many(sources)
    assert all(isinstance(b, cpu.TieredBinary) for b in binaries[:3])
    assert isinstance(binaries[3], Path)  # the reduction: optimized at once
    programs = [cpu.CPUProgram(function_name(s), b) for s, b in zip(sources, binaries)]
    assert programs[0].tier in fast_tiers() and programs[3].tier == "optimized"
    fast_results = [run_kernel(p) for p in programs]
    assert fast_results[:3] == [[(n + 2.0) * x for x in (1, 2, 3, 4)] for n in range(3)]
    assert fast_results[3][0] == 10.0
    release.set()
    cpu.wait_for_optimized_builds(timeout=120)
    assert all(p.tier == "optimized" for p in programs)
    assert [run_kernel(p) for p in programs] == fast_results
    # the disk cache holds the optimized libraries only, with no temporary files
    tiered = binaries[0]
    assert isinstance(tiered, cpu.TieredBinary) and tiered.optimized.path is not None
    assert tiered.optimized.path.parent == cache
    assert tiered.fast.parent != cache
    assert all(p.suffix == ".so" for p in cache.iterdir())
    # a warm cache skips the fast tier
    assert all(isinstance(b, Path) for b in compiler().compile_many(sources))


@pytest.mark.parametrize("setting", [{"CPU_TIERED": 0}, {"BEAM": 1}])
def test_tiering_can_be_turned_off(cache: Path, setting: dict[str, int]) -> None:
    with Context(**setting):
        binaries = compiler().compile_many(unique_kernels(2))
    assert all(isinstance(b, Path) and b.parent == cache for b in binaries)


def test_a_heavy_flag_keeps_a_kernel_off_the_fast_tier(cache: Path) -> None:
    """The ProgramSpec's `heavy` flag, passed beside the source, has compile_many build that
    kernel optimized at once; the same kind of source without the flag starts fast. Flags that
    do not match the sources one to one are refused."""
    first, second = unique_kernels(2)[:2]
    assert not cpu.starts_optimized(first) and cpu.starts_optimized(first, heavy=True)
    binaries = compiler().compile_many([first, second], heavy=[True, False])
    assert isinstance(binaries[0], Path) and binaries[0].parent == cache
    assert isinstance(binaries[1], cpu.TieredBinary)
    assert run_kernel(cpu.CPUProgram(function_name(first), binaries[0])) == [2.0, 4.0, 6.0, 8.0]
    with pytest.raises(ValueError, match="1 heavy flags for 2 sources"):
        compiler().compile_many([first, second], heavy=[True])
    cpu.wait_for_optimized_builds(timeout=120)


def test_compile_errors_come_from_the_optimizing_compiler(cache: Path) -> None:
    broken = "void broken(float* restrict data0) {\n  data0[0] = undeclared_name;\n}\n"
    with pytest.raises(CompileError, match=r"undeclared_name(.|\n)*line \d+: data0\[0\] ="):
        compiler().compile_many([*unique_kernels(1), broken])


def test_without_tcc_the_fast_tier_is_cc_at_O0(cache: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiler().fast, "tcc", None)
    sources = unique_kernels(2)
    binaries = compiler().compile_many(sources)
    assert isinstance(binaries[0], cpu.TieredBinary)
    assert binaries[0].tier == compiler().fast.unoptimized_name
    program = cpu.CPUProgram(function_name(sources[0]), binaries[0])
    assert run_kernel(program) == [2.0, 4.0, 6.0, 8.0]
    cpu.wait_for_optimized_builds(timeout=120)


def hold_background() -> threading.Event:
    """Keep the background worker busy until the returned event is set (its queue waits)."""
    release = threading.Event()
    cpu.background().submit(release.wait, 60)
    return release


def test_debug_2_names_the_tier_of_each_launch(cache: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    x = Tensor(np.arange(8, dtype=np.float32), device="CPU").realize()
    scale = float(np.float32(1 + uuid.uuid4().int % 1000 / 1e4))  # kernels no process has seen
    release = hold_background()
    try:
        with Context(DEBUG=2):
            first, second = (x * scale).exp2(), (x - scale).sqrt()
            Tensor.realize(first, second)
        shown = capsys.readouterr().out
        assert "new kernels on the fast tier" in shown
        assert "build (cc -O2 is compiling in the background)" in shown.replace(
            compiler().optimized_tier, "cc -O2")
    finally:
        release.set()
    cpu.wait_for_optimized_builds(timeout=120)
    with Context(DEBUG=2):
        Tensor.realize((x * scale).exp2(), (x - scale).sqrt())
    assert f"now runs its {compiler().optimized_tier} build" in capsys.readouterr().out
    with np.errstate(invalid="ignore"):
        np.testing.assert_allclose(first.numpy(), np.exp2(np.arange(8) * scale), rtol=1e-6)
        np.testing.assert_allclose(second.numpy(), np.sqrt(np.arange(8) - scale), rtol=1e-6)


def test_a_first_training_step_runs_every_new_kernel_on_a_fast_tier(
        cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Chapter 9's dev-73/74: the first step of a 784-128-10 MLP with Adam, every kernel new
    (an empty cache), runs each kernel's fast build (tcc, or cc -O0: the vector matmuls, which
    tcc cannot build), none waits for cc -O2, and its loss is numpy's."""
    from tinyteach import nn
    from tinyteach.engine.realize import runner_cache

    rng = np.random.default_rng(0)
    Tensor.manual_seed(0)
    layer1, layer2 = nn.Linear(784, 128), nn.Linear(128, 10)
    parameters = [layer1.weight, layer1.bias, layer2.weight, layer2.bias]
    adam = nn.optim.Adam(parameters, lr=1e-3)
    images = rng.standard_normal((128, 784)).astype(np.float32)
    labels = rng.integers(0, 10, 128).astype(np.int32)
    Tensor.realize(*parameters)
    w1, b1, w2, b2 = (p.numpy() for p in parameters)
    runner_cache.clear()  # every kernel of the step is new
    release = hold_background()
    try:
        with Context(DEBUG=2, TRAINING=1):
            adam.zero_grad()
            loss = layer2(layer1(Tensor(images)).relu()).sparse_categorical_crossentropy(
                Tensor(labels)).backward()
            Tensor.realize(loss, *adam.schedule_step())
        lines = capsys.readouterr().out.splitlines()
    finally:
        release.set()
    cpu.wait_for_optimized_builds(timeout=120)
    summaries = [line for line in lines if "new kernels on the fast tier" in line]
    fast, new = (int(n) for n in re.search(r"CPU compile: (\d+) of (\d+)", summaries[0]).groups())
    assert len(summaries) == 1 and fast == new > 20
    launches = [line for line in lines if line.startswith("*** CPU")]
    tiers = [re.search(r"us \((.+)\)$", line) for line in launches]
    assert len(launches) == new and all(tiers)  # each launch names its fast tier: none waited
    assert {match.group(1) for match in tiers if match} <= set(fast_tiers())
    logits = np.maximum(images @ w1.T + b1, 0) @ w2.T + b2
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probabilities = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    expected = -log_probabilities[np.arange(128), labels].mean()
    np.testing.assert_allclose(loss.item(), expected, rtol=1e-5)


def test_a_jit_graph_runs_the_optimized_build_once_it_is_swapped_in(cache: Path) -> None:
    offset = float(uuid.uuid4().int % 1000) + 0.25  # new kernels: they start on the fast tier

    def two_kernels(t: Tensor) -> tuple[Tensor, Tensor]:
        first, second = (t + offset) * 3.0, (t - offset).exp2()
        Tensor.realize(first, second)  # one schedule, two new kernels: compile_many tiers them
        return first, second
    step = TinyJit(two_kernels)
    data = [np.arange(8, dtype=np.float32) + k for k in range(5)]
    release = hold_background()
    try:
        results = [[r.numpy() for r in step(Tensor(d, device="CPU").realize())]
                   for d in data[:3]]
        graph = step.captured.graph if step.captured is not None else None
        assert isinstance(graph, cpu.CPUGraph)
        assert any(p.tier != "optimized" for p in graph.programs)  # type: ignore[attr-defined]
    finally:
        release.set()
    cpu.wait_for_optimized_builds(timeout=120)
    results += [[r.numpy() for r in step(Tensor(d, device="CPU").realize())]
                for d in data[3:]]
    assert [graph.kernels[k] for k in range(len(graph.programs))] == \
        [p.function_address() for p in graph.programs]
    assert all(getattr(p, "tier", None) == "optimized" for p in graph.programs)
    for d, (first, second) in zip(data, results):
        np.testing.assert_allclose(first, (d + np.float32(offset)) * 3, rtol=1e-6)
        np.testing.assert_allclose(second, np.exp2(d - np.float32(offset)), rtol=1e-6)


def test_the_graph_replays_only_native_kernels() -> None:
    class NotNative:
        def __call__(self, *buffers: Buffer) -> None: ...

    class FakeRunner:
        program = NotNative()

    class FakeLaunch:
        runner = FakeRunner()
        buffers: list[Buffer] = []

    with pytest.raises(TypeError, match="NotNative"):
        cpu.native_kernels([FakeLaunch()])


# ---- the order and the groups of the builds ----

def test_waited_kernels_are_split_over_the_cores_by_source_length() -> None:
    """balanced_groups: every source once, each group in the given order, and the groups'
    lengths as even as the longest-first rule makes them (by count, the 439 KB of one GPT
    group took 11.2 s beside 2.8 s for the other)."""
    sources = ["a" * 900, "b" * 100, "c" * 100, "d" * 100, "e" * 800, "f" * 100]
    groups = cpu.balanced_groups(sources, 2)
    assert sorted(s for g in groups for s in g) == sorted(sources)
    assert all(g == [s for s in sources if s in g] for g in groups)
    assert sorted(sum(map(len, g)) for g in groups) == [1000, 1100]
    assert cpu.balanced_groups(sources[:1], 4) == [sources[:1]]  # never an empty group
    assert cpu.balanced_groups([], 2) == []


def test_background_builds_come_in_runs_of_a_few_kernels() -> None:
    """runs_of_size: consecutive runs, each at least one source, a run closed once it holds
    `nbytes` of source; a source longer than that is a run of its own."""
    sources = ["x" * 10, "y" * 10, "z" * 25, "w" * 5, "v" * 5]
    runs = cpu.runs_of_size(sources, nbytes=20)
    assert [s for run in runs for s in run] == sources
    assert runs == [sources[:2], sources[2:3], sources[3:]]
    assert cpu.runs_of_size([], nbytes=20) == []


def test_the_costliest_kernels_are_optimized_first(cache: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """With costs (the specs' instructions), the fast tier's optimized builds are queued in
    order of cost per byte of source: what saves the most per second of gcc comes first. Each
    build is a group of its own here (BACKGROUND_GROUP_BYTES of 1): it swaps in by itself."""
    queued_groups: list[list[str]] = []
    optimize = cpu.ClangStyleCompiler._optimize

    def recorded(self: cpu.ClangStyleCompiler, queued: list) -> None:
        queued_groups.extend(group for group, _ in queued)
        optimize(self, queued)
    monkeypatch.setattr(cpu.ClangStyleCompiler, "_optimize", recorded)
    monkeypatch.setattr(cpu, "BACKGROUND_GROUP_BYTES", 1)
    sources = unique_kernels(4)[:4]  # elementwise kernels only: all start on the fast tier
    costs = [10, 4000, 70, 900]
    binaries = compiler().compile_many(sources, costs=costs)
    assert all(isinstance(b, cpu.TieredBinary) for b in binaries)
    cpu.wait_for_optimized_builds(timeout=120)
    assert queued_groups == [[sources[1]], [sources[3]], [sources[2]], [sources[0]]]
    assert len({b.optimized.path for b in binaries if isinstance(b, cpu.TieredBinary)}) == 4
    with pytest.raises(ValueError, match="3 costs for 4 sources"):
        compiler().compile_many(sources, costs=costs[:3])


def test_a_kernels_instructions_count_the_work_of_its_unoptimized_build() -> None:
    """render/c.py's instructions_of (the spec's `instructions`): the operations in the
    loops times the loops' sizes. Twice the elements, about twice the instructions; an
    exponential per element costs more than an addition (it is arithmetic there:
    codegen/transcendental.py)."""
    from tinyteach.codegen.lower import lower
    from tinyteach.engine.schedule import create_schedule
    from tinyteach.opt.heuristic import heuristic_plan

    def instructions(result: Tensor) -> int:
        items = [i for i in create_schedule([result.uop], "CPU")[0] if i.kind == "kernel"]
        assert len(items) == 1
        renderer = Device["CPU"].renderer
        spec = renderer.spec(items[0].name, lower(items[0].ast, heuristic_plan(items[0].ast)))
        return spec.instructions
    small = instructions(Tensor.empty(4096, device="CPU") + 1)
    large = instructions(Tensor.empty(8192, device="CPU") + 1)
    assert 1.8 <= large / small <= 2.2
    assert instructions(Tensor.empty(4096, device="CPU").exp()) > 4 * small
