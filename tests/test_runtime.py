"""Chapter 9: devices and runtimes — the CPU compile cache, CC, compile errors, Device.DEFAULT
and DEV, unknown devices, freeing buffers, and NUMPY agreeing with CPU on random fused graphs."""
from __future__ import annotations

import ast
import gc
import inspect
import multiprocessing
import os
import shutil
import uuid
import weakref
from pathlib import Path

import numpy as np
import pytest
from helpers import PRINT_DEFAULT_DEVICE, python_with_env

import tinyteach.runtime.cpu as cpu
from tinyteach import Tensor, dtypes
from tinyteach.device import CompileError, Device

ADD_ONE = """void add_one(float* restrict data0, const float* restrict data1) {
  for (int i = 0; i < 4; i++) { data0[i] = data1[i] + 1.0f; }
}
"""


def fresh_source() -> str:
    """A kernel source no cache has seen: a unique comment changes the hash."""
    return f"/* {uuid.uuid4()} */\n{ADD_ONE}"


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    # an optimized build that an earlier test started in the background would otherwise
    # write its temporary file into this test's fresh cache (the folder is read when it starts)
    cpu.wait_for_optimized_builds(timeout=300)
    monkeypatch.setenv("TINYTEACH_CACHE", str(tmp_path))
    return tmp_path / "cpu"


def compiler() -> cpu.ClangStyleCompiler:
    return cpu.ClangStyleCompiler(cpu.find_c_compiler())


def run_add_one(library: Path) -> list[float]:
    from tinyteach.device import Buffer
    out, inp = Buffer("CPU", 4, dtypes.float32), Buffer("CPU", 4, dtypes.float32)
    inp.copyin(np.array([1, 2, 3, 4], dtype=np.float32))
    cpu.CPUProgram("add_one", library)(out, inp)
    return out.numpy().tolist()


# ---- the compile cache ----

def test_compile_writes_one_file_to_the_cache(cache):
    path = compiler().compile(fresh_source())
    assert path.parent == cache and path.suffix == ".so"
    assert sorted(p.name for p in cache.iterdir()) == [path.name]  # no temporary files left
    assert run_add_one(path) == [2.0, 3.0, 4.0, 5.0]


def test_second_compile_hits_the_cache(cache, monkeypatch):
    source, c = fresh_source(), compiler()
    first = c.compile(source)

    def no_compiler(*args, **kwargs):
        raise AssertionError("the compiler ran again")
    monkeypatch.setattr(cpu.subprocess, "run", no_compiler)
    assert c.compile(source) == first


def test_cache_key_includes_compiler_and_flags(cache):
    source, c = fresh_source(), compiler()
    first = c.compile(source)
    other = compiler()
    other.cache_key = c.cache_key + " -DSOMETHING_ELSE"
    assert other.compile(source) != first


def _compile_in_child(source: str, cache_root: str) -> str:
    os.environ["TINYTEACH_CACHE"] = cache_root
    return str(compiler().compile(source))


def test_processes_compiling_at_once_all_succeed(tmp_path):
    source = fresh_source()
    context = multiprocessing.get_context("spawn")
    with context.Pool(4) as pool:
        paths = pool.starmap(_compile_in_child, [(source, str(tmp_path))] * 8)
    assert len(set(paths)) == 1
    files = list((tmp_path / "cpu").iterdir())
    assert [f.name for f in files] == [Path(paths[0]).name]
    assert run_add_one(Path(paths[0])) == [2.0, 3.0, 4.0, 5.0]


def test_the_runtime_never_unpickles():
    tree = ast.parse(inspect.getsource(cpu))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not imported & {"pickle", "marshal", "shelve", "dill", "cloudpickle"}


# ---- choosing the compiler ----

@pytest.mark.parametrize("name", ["gcc", "clang"])
def test_cc_override(name, cache, monkeypatch):
    if shutil.which(name) is None:
        pytest.skip(f"{name} is not installed")
    monkeypatch.setenv("CC", name)
    c = compiler()
    assert Path(c.compiler).name == name
    assert name in c.cache_key or Path(shutil.which(name)).name in c.cache_key
    assert run_add_one(c.compile(fresh_source())) == [2.0, 3.0, 4.0, 5.0]


def test_missing_compiler_is_reported(monkeypatch):
    monkeypatch.setenv("CC", "no-such-compiler-xyz")
    with pytest.raises(RuntimeError, match="no-such-compiler-xyz"):
        cpu.find_c_compiler()


# ---- compile errors ----

def test_compile_error_shows_the_message_and_the_line(cache):
    bad = ("void broken(float* restrict data0) {\n  int ok = 1;\n"
           "  data0[0] = undeclared_x + ok;\n}\n")
    with pytest.raises(CompileError) as error:
        compiler().compile(bad)
    message = str(error.value)
    assert "undeclared_x" in message and "error" in message
    assert "line 3" in message and "data0[0] = undeclared_x + ok;" in message
    assert not cache.exists() or list(cache.iterdir()) == []  # nothing half-written is left


def test_compile_error_is_raised_through_the_engine(cache):
    from tinyteach.ir.uop import Ops
    from tinyteach.render.c import CRenderer

    class BrokenRenderer(CRenderer):
        def store(self, buffer: str, index: str, value: str, *more: object) -> str:
            return f"{buffer}[{index}] = {value} +* ;"

    backend = Device["CPU"]
    saved = backend.renderer
    backend.renderer = BrokenRenderer()
    try:
        from tinyteach.engine.realize import compile_kernel
        from tinyteach.engine.schedule import create_schedule
        a = Tensor(np.ones(3, dtype=np.float32), device="CPU").realize()
        items, _ = create_schedule([(a * 3.125).uop], "CPU")
        with pytest.raises(CompileError, match=r"\+\* ;"):
            compile_kernel(backend, items[0].name, items[0].ast)
        assert items[0].ast.op is Ops.SINK
    finally:
        backend.renderer = saved


# ---- choosing a device ----

DEFAULT = PRINT_DEFAULT_DEVICE


def test_default_device_is_the_best_available():
    result = python_with_env(DEFAULT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["CPU", "CPU"]


@pytest.mark.parametrize("env", [{"DEV": "NUMPY"}, {"DEV": "numpy"}, {"NUMPY": "1"}])
def test_dev_environment_variable(env):
    result = python_with_env(DEFAULT, **env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["NUMPY", "NUMPY"]


def test_dev_unknown_device_is_an_error():
    result = python_with_env(DEFAULT, DEV="NOPE")
    assert result.returncode != 0
    assert "NOPE" in result.stderr and "NUMPY" in result.stderr and "CPU" in result.stderr


def test_unknown_device_names_it_and_lists_the_available_ones():
    for attempt in (lambda: Device["TPU9"], lambda: Tensor([1.0], device="TPU9"),
                    lambda: Tensor([1.0], device="NUMPY").to("TPU9")):
        with pytest.raises(ValueError) as error:
            attempt()
        message = str(error.value)
        assert "TPU9" in message and "NUMPY" in message and "CPU" in message


def test_device_names_are_canonical():
    assert Device.canonicalize("cpu") == "CPU" and Device.canonicalize("CPU:0") == "CPU"
    assert Device["numpy"] is Device["NUMPY"]
    assert {"NUMPY", "CPU"} <= set(Device.available())


# ---- memory ----

@pytest.mark.parametrize("device", ["NUMPY", "CPU"])
def test_buffers_are_freed_when_tensors_die(device):
    a = Tensor(np.ones((64, 64), dtype=np.float32), device=device).realize()
    b = (a * 2 + 1).realize()
    node = b.uop
    while node.src:
        node = node.src[0]
    buffer = weakref.ref(node.arg)
    assert buffer() is not None and buffer().is_allocated
    del b, node
    gc.collect()
    assert buffer() is None


def test_buffer_allocates_on_first_use():
    from tinyteach.device import Buffer
    buffer = Buffer("CPU", 10, dtypes.int32)
    assert not buffer.is_allocated and buffer.nbytes == 40
    assert buffer.numpy().shape == (10,)
    assert buffer.is_allocated and buffer.storage.address % 64 == 0


def test_freed_host_memory_is_reused():
    from tinyteach.device import HostMemory
    first = HostMemory(12345)
    address = first.address
    del first  # back to the pool ...
    second = HostMemory(12345)  # ... and out again for the same size, without a page fault
    assert second.address == address and second.address % 64 == 0
    assert HostMemory(12346).address != address


def test_reused_memory_never_leaks_into_results():
    from tinyteach import Tensor
    for _ in range(3):  # each round reuses the last round's freed buffers
        x = Tensor(np.full((64, 64), 7.0, dtype=np.float32))
        np.testing.assert_array_equal(((x * 2).sum(0) + 1).numpy(), np.full(64, 64 * 14 + 1.0))


# ---- NUMPY and CPU agree on random fused graphs ----

UNARY = [lambda x: x.exp(), lambda x: x.relu(), lambda x: x.sin(), lambda x: x.abs().sqrt(),
         lambda x: -x, lambda x: x * 0.5, lambda x: (x.abs() + 1).log(), lambda x: x.tanh()]
BINARY = [lambda x, y: x + y, lambda x, y: x * y, lambda x, y: x - y,
          lambda x, y: x.maximum(y), lambda x, y: (x < y).where(x, y)]
MOVE = [lambda x: x.T, lambda x: x.flip(0), lambda x: x[1:, :-1].pad(((0, 1), (1, 0))),
        lambda x: x.reshape(-1).reshape(x.shape)]
REDUCE = [lambda x: x.sum(axis=1, keepdim=True).expand(x.shape),
          lambda x: x.max(axis=0, keepdim=True).expand(x.shape)]


def random_graph(rng: np.random.Generator, leaves: list[Tensor]) -> Tensor:
    values = list(leaves)
    for _ in range(int(rng.integers(3, 8))):
        kind = rng.random()
        x = values[int(rng.integers(0, len(values)))]
        if kind < 0.35:
            values.append(UNARY[int(rng.integers(0, len(UNARY)))](x))
        elif kind < 0.7:
            y = values[int(rng.integers(0, len(values)))]
            values.append(BINARY[int(rng.integers(0, len(BINARY)))](x, y))
        elif kind < 0.9:
            values.append(MOVE[int(rng.integers(0, len(MOVE)))](x))
        else:
            values.append(REDUCE[int(rng.integers(0, len(REDUCE)))](x))
    return values[-1].sum(axis=1) if rng.random() < 0.5 else values[-1]


@pytest.mark.parametrize("seed", range(12))
def test_numpy_and_cpu_agree_on_random_fused_graphs(seed):
    inputs = np.random.default_rng(seed).normal(size=(3, 4, 4)).astype(np.float32)
    results = {}
    for device in ("NUMPY", "CPU"):
        rng = np.random.default_rng(seed)  # the same graph on both devices
        leaves = [Tensor(inputs[k], device=device) for k in range(3)]
        results[device] = random_graph(rng, leaves).numpy()
    np.testing.assert_allclose(results["CPU"], results["NUMPY"], rtol=2e-5, atol=2e-5)


INT_BINARY = [lambda x, y: x + y, lambda x, y: x * y, lambda x, y: x - y,
              lambda x, y: x // y, lambda x, y: x % y, lambda x, y: x ^ y, lambda x, y: x & y,
              lambda x, y: x.maximum(y), lambda x, y: (x < y).where(x, y)]


@pytest.mark.parametrize("dtype", [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.int32,
                                   dtypes.uint32, dtypes.int64])
def test_numpy_and_cpu_agree_on_integer_graphs(dtype):
    rng = np.random.default_rng(dtype.itemsize)
    info = np.iinfo(dtype.np)
    low, high = max(info.min, -1000), min(info.max, 1000)
    a = rng.integers(low, high, size=(4, 6), endpoint=True).astype(dtype.np)
    b = rng.integers(low, high, size=(4, 6), endpoint=True).astype(dtype.np)
    a[0, :3] = [info.min, info.max, 0]
    b[0, :3] = [-1 if info.min < 0 else 1, 1, 0]
    results = {}
    for device in ("NUMPY", "CPU"):
        x, y = Tensor(a, device=device), Tensor(b, device=device)
        outs = [f(x, y) for f in INT_BINARY]
        outs.append(((x + y) * y < x).where(x * x, y - x))  # overflow seen through a compare
        results[device] = [o.numpy() for o in outs]
    for ours, reference in zip(results["CPU"], results["NUMPY"]):
        np.testing.assert_array_equal(ours, reference)


def test_same_constant_graph_on_two_devices_gets_two_buffers():
    # an arange is made only of constants: its graph is identical on every device, and a value
    # computed on NUMPY must not be reused for a CPU tensor
    first = Tensor.arange(7, device="NUMPY").realize()
    second = Tensor.arange(7, device="CPU").realize()
    buffers = [n.arg for t in (first, second) for n in t.uop.toposort if n.op.name == "BUFFER"]
    assert [b.device for b in buffers] == ["NUMPY", "CPU"]
    assert second.numpy().tolist() == list(range(7))


def test_padded_rows_survive_the_c_compiler():
    # gcc 12 at -O3 -march=native (AVX-512) vectorized this guarded, wrapped load wrongly and
    # dropped the second row; found by tests/fuzz_graphs.py
    a = np.arange(1, 5, dtype=np.float32).reshape(2, 2)
    for device in ("NUMPY", "CPU"):
        padded = Tensor(a, device=device).pad(((1, 2), (0, 0))).numpy()
        np.testing.assert_array_equal(padded, np.pad(a, ((1, 2), (0, 0))))


def test_buffers_of_dead_tensors_are_freed_at_once():
    """Without waiting for Python's cycle collector: a graph holds no reference cycles."""
    import gc
    import weakref

    from tinyteach import Tensor
    gc.collect()
    gc.disable()
    try:
        t = Tensor(np.ones((8, 8), dtype=np.float32)).realize()
        r = t.softmax(-1).realize()
        inputs = weakref.ref(t.uop.src[0].arg)
        outputs = weakref.ref(r.uop.src[0].arg if r.uop.src else r.uop.arg)
        del t, r
        assert inputs() is None and outputs() is None
    finally:
        gc.enable()


def test_cpu_vector_width_can_be_pinned(monkeypatch):
    """CPU_VECTOR_WIDTH overrides the CPU's own lanes (the book's outputs are a 16-lane CPU's);
    anything but a supported width is refused with a clear error."""
    from tinyteach.runtime.cpu import vector_width
    avx2 = "#define __AVX__ 1\n#define __SSE2__ 1\n"
    monkeypatch.delenv("CPU_VECTOR_WIDTH", raising=False)
    assert vector_width(avx2) == 8
    for pinned in ("16", "4", "0"):
        monkeypatch.setenv("CPU_VECTOR_WIDTH", pinned)
        assert vector_width(avx2) == int(pinned)
    for bad in ("12", "wide", "-4"):
        monkeypatch.setenv("CPU_VECTOR_WIDTH", bad)
        with pytest.raises(ValueError, match="CPU_VECTOR_WIDTH"):
            vector_width(avx2)
