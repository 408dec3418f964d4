"""The optimizer's actions (issue 24): a kernel's optimization is a list of `Opt`s, applied one
by one to a `Kernel`, each checked when it is applied. The heuristic and BEAM produce such lists,
a person can type one, and realize compiles exactly what the list gives."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from helpers import test_devices

from tinyteach import Tensor
from tinyteach.device import NO_CAPABILITIES, Capabilities, Device
from tinyteach.engine.realize import record_launches
from tinyteach.engine.schedule import create_schedule
from tinyteach.opt import Kernel, KernelOptError, Opt, OptOps, hand_coded_optimizations
from tinyteach.opt.heuristic import heuristic_actions
from tinyteach.opt.kernel import actions_of, plan_of

PACKAGE = Path(__file__).parent.parent / "tinyteach"
DEVICES = [d for d in test_devices() if d in ("CPU", "OPENCL", "PYTHON", "WEBGPU")]


def floats(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)


def last_kernel(out: Tensor, device: str):
    items = [i for i in create_schedule([out.uop], device)[0] if i.kind == "kernel"]
    return items[-1]


def matmul(device: str, n: int = 256):
    a = Tensor(floats(n, n), device=device).realize()
    b = Tensor(floats(n, n, seed=1), device=device).realize()
    return a, b, last_kernel(a @ b, device)


@pytest.mark.parametrize("device", [d for d in DEVICES if d in ("CPU", "OPENCL")])
def test_actions_by_hand_give_a_program(device):
    _, _, item = matmul(device)
    kernel = Kernel(item.ast, device)
    kernel.apply_opt(Opt(OptOps.UPCAST, 0, 4))
    kernel.apply_opt(Opt(OptOps.UPCAST, 1, 4))
    program = kernel.to_program("mm")
    assert kernel.applied_opts == [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 4)]
    assert program.linear.options.upcasts == ((0, 4), (1, 4))
    assert "mm" in program.source


@pytest.mark.parametrize("device", [d for d in DEVICES if d in ("CPU", "OPENCL")])
def test_an_action_that_does_not_fit_says_why(device):
    _, _, item = matmul(device)
    with pytest.raises(KernelOptError, match=r"axis 0 of size 256 does not split into blocks "
                                             r"of 7"):
        Kernel(item.ast, device).apply_opt(Opt(OptOps.UPCAST, 0, 7))
    with pytest.raises(KernelOptError, match="the output has axes 0..1"):
        Kernel(item.ast, device).apply_opt(Opt(OptOps.UPCAST, 5, 2))
    with pytest.raises(TypeError, match="apply_opt takes an Opt"):
        Kernel(item.ast, device).apply_opt(("UPCAST", 0, 4))  # type: ignore[arg-type]


def test_a_missing_capability_is_named():
    _, _, item = matmul("CPU")
    with pytest.raises(KernelOptError, match="CPU has no local tiles"):
        Kernel(item.ast, "CPU").apply_opt(Opt(OptOps.LOCAL, 0, 16))
    if "OPENCL" in DEVICES:
        _, _, gpu_item = matmul("OPENCL")
        with pytest.raises(KernelOptError, match="OPENCL has no threads over CPU cores"):
            Kernel(gpu_item.ast, "OPENCL").apply_opt(Opt(OptOps.THREAD, 0, 0))
        with pytest.raises(KernelOptError, match="OPENCL has no tensor cores"):
            Kernel(gpu_item.ast, "OPENCL").apply_opt(Opt(OptOps.TC, 0, 0))


@pytest.mark.parametrize("device", [d for d in DEVICES if d in ("CPU", "OPENCL")])
def test_the_heuristics_actions_give_the_source_realize_compiles(device):
    a, b, item = matmul(device)
    kernel = Kernel(item.ast, device)
    actions = hand_coded_optimizations(kernel)
    assert actions, "the heuristic optimizes a 256x256 matmul"
    by_hand = kernel.apply_opts(actions).to_program(item.name)
    with record_launches() as launches:
        (a @ b).realize()
    ran = [launch.runner for launch in launches if launch.runner.ast is item.ast]
    assert ran and ran[0].source == by_hand.source


def test_a_local_tile_needs_both_axes_and_fits_shared_memory():
    if "OPENCL" not in DEVICES:
        pytest.skip("OPENCL is not available here")
    _, _, item = matmul("OPENCL")
    half = Kernel(item.ast, "OPENCL").apply_opt(Opt(OptOps.LOCAL, 0, 16))
    with pytest.raises(KernelOptError, match="needs LOCAL on both axes"):
        half.to_program()
    with pytest.raises(KernelOptError, match="the other axis has 16"):
        Kernel(item.ast, "OPENCL").apply_opts([Opt(OptOps.LOCAL, 0, 16), Opt(OptOps.LOCAL, 1, 8)])
    big = Kernel(item.ast, "OPENCL").apply_opts(
        [Opt(OptOps.LOCAL, 0, 16), Opt(OptOps.LOCAL, 1, 16), Opt(OptOps.UPCAST, 0, 16),
         Opt(OptOps.UPCAST, 1, 16)])
    with pytest.raises(KernelOptError, match="shared memory"):
        big.to_program()


# ---- the actions the heuristic had no word for: UNROLL, PADTO, GROUPTOP ----

def run_with(device: str, out: Tensor, opts: list[Opt], monkeypatch) -> np.ndarray:
    """Realize `out` with these actions on its last kernel (realize applies them, as it
    applies the heuristic's), after checking that the kernel ran with them."""
    from tinyteach.helpers import clear_caches
    from tinyteach.opt import search
    ast = last_kernel(out, device).ast
    chosen = search.actions_for
    monkeypatch.setattr(search, "actions_for", lambda backend, name, kernel_ast:
                        list(opts) if kernel_ast is ast else chosen(backend, name, kernel_ast))
    clear_caches()
    with record_launches() as launches:
        got = out.numpy()
    expected = plan_of(ast, opts, Device[device].capabilities, device)
    assert any(launch.runner.linear.options == expected for launch in launches)
    clear_caches()
    return got


@pytest.mark.parametrize("device", [d for d in DEVICES if d != "PYTHON"])
def test_unroll_sums_the_same(device, monkeypatch):
    x = floats(24, 64)
    out = Tensor(x, device=device).sum(axis=1)
    with pytest.raises(KernelOptError, match="does not split into steps of 5"):
        Kernel(last_kernel(out, device).ast, device).apply_opt(Opt(OptOps.UNROLL, 0, 5))
    got = run_with(device, out, [Opt(OptOps.UNROLL, 0, 4)], monkeypatch)
    np.testing.assert_allclose(got, x.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", [d for d in DEVICES if d != "PYTHON"])
def test_an_unrolled_max_keeps_nan_and_its_source_stays_small(device, monkeypatch):
    """C's float max writes its first operand three times (NaN wins); unrolled by 8, each
    level's inline copy held the level below it three times: 1.2 MB of C for a max over 64
    (issue 25). Nested maxima get names now."""
    x = floats(16, 64)
    x[3, 17], x[5, 63] = np.nan, np.inf
    out = Tensor(x, device=device).max(axis=1)
    opts = [Opt(OptOps.UNROLL, 0, 8)]
    source = Kernel(last_kernel(out, device).ast, device).apply_opts(opts).to_program().source
    assert len(source) < 8000, len(source)
    got = run_with(device, out, opts, monkeypatch)
    np.testing.assert_array_equal(got, x.max(axis=1))


@pytest.mark.parametrize("device", [d for d in DEVICES if d != "PYTHON"])
def test_padto_lets_an_odd_axis_be_upcast(device, monkeypatch):
    x, y = floats(30, 16), floats(16, 10, seed=1)
    out = Tensor(x, device=device) @ Tensor(y, device=device)
    with pytest.raises(KernelOptError, match="PADTO first pads it"):
        Kernel(last_kernel(out, device).ast, device).apply_opt(Opt(OptOps.UPCAST, 0, 4))
    got = run_with(device, out, [Opt(OptOps.PADTO, 0, 4), Opt(OptOps.UPCAST, 0, 4)],
                   monkeypatch)
    np.testing.assert_allclose(got, x.astype(np.float64) @ y, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("options, message", [
    (dict(upcasts=((0, 4),)), "upcast of axis 0 by 4: the factor does not divide"),
    (dict(upcasts=((1, 12),), vector_width=8), "upcast by 12 is not a whole number of vectors"),
    (dict(upcasts=((1, 8),), unrolls=((0, 3),)), "unroll of reduced axis 0 by 3"),
])
def test_a_plan_whose_factor_does_not_divide_its_axis_is_refused(options, message):
    """A plan typed as KernelOptions (below the actions, which check each step) is checked when
    it is lowered: an upcast of 30 rows by 4 computed 28 and silently left 2 unwritten."""
    from tinyteach.codegen.lower import lower_ast
    from tinyteach.codegen.plan import KernelOptions
    out = Tensor(floats(30, 16)) @ Tensor(floats(16, 24, seed=1))
    with pytest.raises(ValueError, match=message):
        lower_ast(last_kernel(out, "CPU").ast, KernelOptions(**options))


@pytest.mark.parametrize("device", [d for d in DEVICES if d != "CPU"])
@pytest.mark.parametrize("op", [OptOps.GROUP, OptOps.GROUPTOP])
def test_group_and_grouptop_sum_the_same(device, op, monkeypatch):
    x = floats(4, 1000)
    out = Tensor(x, device=device).sum(axis=1)
    got = run_with(device, out, [Opt(op, 0, 16)], monkeypatch)
    np.testing.assert_allclose(got, x.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-5)


# ---- the plans the heuristic chooses are action lists ----

KERNELS = {
    "matmul": (lambda a, b: a @ b, [(64, 48), (48, 96)]),
    "sum": (lambda a, b: (a * b).sum(axis=1), [(64, 300), (64, 300)]),
    "softmax": (lambda a, b: (a + b).softmax(-1), [(32, 100), (32, 100)]),
    "elementwise": (lambda a, b: (a * b + 1).exp(), [(128, 64), (128, 64)]),
    "conv": (lambda a, b: a.conv2d(b), [(2, 3, 12, 12), (8, 3, 3, 3)]),
    "big_matmul": (lambda a, b: a @ b, [(128, 784), (784, 128)]),  # threads, on a CPU
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_every_heuristic_plan_is_its_action_list(device, name):
    build, shapes = KERNELS[name]
    tensors = [Tensor(floats(*s, seed=k), device=device).realize() for k, s in enumerate(shapes)]
    backend = Device[device]
    for item in create_schedule([build(*tensors).uop], device)[0]:
        if item.kind != "kernel":
            continue
        actions = heuristic_actions(item.ast, backend.capabilities)
        rebuilt = plan_of(item.ast, actions, backend.capabilities, device)
        assert actions_of(item.ast, rebuilt) == actions
        from tinyteach.opt.heuristic import options_for
        assert rebuilt == options_for(item.ast, backend.capabilities)


def test_capabilities_are_data():
    assert Device["CPU"].capabilities.vector_width > 0 and Device["CPU"].capabilities.threads
    assert Device["NUMPY"].capabilities == NO_CAPABILITIES
    python = Device["PYTHON"].capabilities
    assert python.gpu and python.group_reduce and (16, 8, 16) in python.tensor_cores
    assert isinstance(python, Capabilities)


def test_no_module_probes_a_renderer_for_capabilities():
    probe = re.compile(r"(getattr|hasattr)\([^)]*(renderer|backend)[^)]*\"(supports_|"
                       r"output_loops|vector_width|thread_id)")
    paths = [*(PACKAGE / "opt").glob("*.py"), *(PACKAGE / "codegen").glob("*.py"),
             PACKAGE / "engine/schedule.py"]
    for path in paths:
        assert not probe.search(path.read_text()), f"{path} probes a renderer with getattr/hasattr"


def test_the_beam_cache_holds_actions(tmp_path, monkeypatch):
    from tinyteach.opt import search
    monkeypatch.setenv("TINYTEACH_CACHE", str(tmp_path))
    _, _, item = matmul("CPU", 64)
    backend = Device["CPU"]
    plan = search.heuristic_options(backend, item.ast)
    key = search.cache_key(backend, item.ast, 2)
    search.write_cached(key, item.ast, search.SearchResult(plan, 1.0, 1.0, 1))
    stored = json.loads((tmp_path / "beam" / f"{key}.json").read_text())["actions"]
    assert [Opt(OptOps[o], a, g) for o, a, g in stored] == actions_of(item.ast, plan)


def test_debug_3_prints_the_actions_as_a_person_would_type_them(capsys):
    """DEBUG=3 names each compiled kernel's actions (the Opts, tinygrad's applied_opts), then
    what they do in words."""
    from tinyteach import Context
    a, b, item = matmul("CPU", 64)
    with Context(DEBUG=3):
        (a @ b).realize()
    lines = capsys.readouterr().out.splitlines()
    expected = hand_coded_optimizations(Kernel(item.ast, "CPU"))
    assert f"    actions of {item.name}: {expected}" in lines
    assert any(line.startswith(f"    optimizations of {item.name}: upcast") for line in lines)
