"""Chapter 6 (issue 16): a chain of reductions over the same rows in one kernel (FUSE_ROWS).

softmax, log_softmax and layernorm (and their backward passes) are one kernel on the devices
whose output loops are loops (NUMPY, CPU) and on GPU devices (OPENCL, WEBGPU, PYTHON: one
work-group per row, tests/test_gpu_rows.py); FUSE_ROWS=0 gives the old three kernels
everywhere. Values, NaN and ±inf rows and a size-1 row axis included, are checked against
PyTorch on every device with the path on and off. The lowering computes each row's reductions
once per row, before the loop over the row's outputs: the tests count loops and accumulators in
the linear program and the C source, so a placement that recomputed them per element (O(n²)
work) fails."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from helpers import test_devices

from tinyteach import GlobalCounters, Tensor
from tinyteach.codegen.lower import LinearProgram, lower
from tinyteach.codegen.plan import NO_OPTIONS
from tinyteach.engine import schedule as schedule_module
from tinyteach.engine.schedule import MAX_FUSED_ROW_BYTES, ScheduleItem, create_schedule
from tinyteach.helpers import Context
from tinyteach.ir.uop import Ops
from tinyteach.opt.heuristic import heuristic_plan
from tinyteach.render.c import CRenderer

LOOP_DEVICES = ["NUMPY", "CPU"]
DEVICES = [d for d in test_devices() if d != "CUDA"]  # (CUDA runs nothing without a GPU)


def torch_layernorm(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x, x.shape[-1:], eps=1e-5)


OPS = {
    "softmax": (lambda x: x.softmax(-1), lambda x: torch.softmax(x, -1)),
    "log_softmax": (lambda x: x.log_softmax(-1), lambda x: torch.log_softmax(x, -1)),
    "layernorm": (lambda x: x.layernorm(-1, eps=1e-5), torch_layernorm),
}


def schedule_of(tensor: Tensor) -> list[ScheduleItem]:
    items, _ = create_schedule([tensor.uop], tensor.device)
    return items


def kernel_count(build, device: str) -> int:
    GlobalCounters.reset()
    build().realize()
    return GlobalCounters.kernel_count


def inputs(shape: tuple[int, ...], special: bool) -> np.ndarray:
    """Normal floats; with `special`, one row holds a NaN, one +inf, one -inf everywhere and
    one a +inf and a -inf (the softmax of each is NaN or exact, as in PyTorch)."""
    values = np.random.default_rng(1).standard_normal(shape).astype(np.float32) * 3
    if special:
        rows = values.reshape(-1, shape[-1])
        rows[0, 0] = np.nan
        rows[1 % len(rows), -1] = np.inf
        rows[2 % len(rows)] = -np.inf
        rows[3 % len(rows), :2] = [np.inf, -np.inf][: rows.shape[1]]
    return values


def compare_with_torch(name: str, values: np.ndarray, device: str) -> None:
    """Forward and the gradient of sum(out * cotangent), as PyTorch computes them."""
    ours_fn, torch_fn = OPS[name]
    cotangent = np.random.default_rng(2).uniform(0.5, 1.5, values.shape).astype(np.float32)
    x = Tensor(values, device=device, requires_grad=True)
    out = ours_fn(x)
    (out * Tensor(cotangent, device=device)).sum().backward()
    expected_x = torch.tensor(values, requires_grad=True)
    expected = torch_fn(expected_x)
    (expected * torch.tensor(cotangent)).sum().backward()
    assert x.grad is not None and expected_x.grad is not None
    np.testing.assert_allclose(out.numpy(), expected.detach().numpy(), rtol=1e-4, atol=1e-5,
                               err_msg=f"{name} on {device}")
    np.testing.assert_allclose(x.grad.numpy(), expected_x.grad.numpy(), rtol=1e-3, atol=1e-4,
                               err_msg=f"gradient of {name} on {device}")


# ---- kernel counts, on and off ----

@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("device", DEVICES)
def test_one_kernel_on_every_device_three_without_row_fusion(name, device):
    x = Tensor(inputs((16, 64), special=False), device=device).realize()
    assert kernel_count(lambda: OPS[name][0](x), device) == 1
    with Context(FUSE_ROWS=0):
        assert kernel_count(lambda: OPS[name][0](x), device) == 3


@pytest.mark.one_case_on_opencl("shape")
@pytest.mark.parametrize("fuse_rows", [1, 0])
@pytest.mark.parametrize("special", [False, True])
@pytest.mark.parametrize("shape", [(6, 33), (2, 3, 16), (5, 1), (17,)])
@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("device", DEVICES)
def test_values_and_gradients_match_torch(device, name, shape, special, fuse_rows):
    with Context(FUSE_ROWS=fuse_rows):
        compare_with_torch(name, inputs(shape, special), device)


@pytest.mark.parametrize("device", LOOP_DEVICES)
def test_backward_of_log_softmax_and_layernorm_fuse_too(device):
    """The gradients' own row sums (of the incoming gradient, of grad * centered) fuse."""
    values = inputs((8, 24), special=False)
    for name in ("log_softmax", "layernorm"):
        x = Tensor(values, device=device, requires_grad=True)
        (OPS[name][0](x) * Tensor(values * 0 + 0.5, device=device)).sum().backward()
        assert x.grad is not None
        assert kernel_count(lambda x=x: x.grad, device) == 1, name


# ---- the reason, in plain words ----

def test_the_fusion_is_written_down_with_the_row_size():
    x = Tensor(inputs((8, 1024), special=False), device="CPU").realize()
    (item,) = schedule_of(x.softmax(-1))
    notes = [note for note in item.fusions if "once per row" in note]
    assert len(notes) == 2  # the max and the sum of exp
    assert notes[0].startswith("the max over each row") and "(4 KiB)" in notes[0]
    assert notes[1].startswith("the sum over each row")
    assert f"{MAX_FUSED_ROW_BYTES // 1024} KiB fuse" in notes[0]
    with Context(FUSE_ROWS=0):
        reasons = [item.boundary_reason for item in schedule_of(x.softmax(-1))]
    assert any("broadcast back (EXPAND)" in reason for reason in reasons)


def test_rows_longer_than_the_limit_are_stored():
    row = MAX_FUSED_ROW_BYTES // 4  # float32s in the longest fused row
    x = Tensor(np.zeros((2, row), np.float32), device="CPU").realize()
    assert len(schedule_of(x.softmax(-1))) == 1
    y = Tensor(np.zeros((2, row + 1), np.float32), device="CPU").realize()
    items = schedule_of(y.softmax(-1))
    assert len(items) == 3
    assert not any("once per row" in note for item in items for note in item.fusions)


def test_rows_that_are_not_the_innermost_axes_are_stored():
    """softmax over axis 0: each column's max would sit inside the loop over rows."""
    values = inputs((12, 7), special=False)
    x = Tensor(values, device="CPU").realize()
    assert len(schedule_of(x.softmax(0))) == 3
    np.testing.assert_allclose(x.softmax(0).numpy(), torch.softmax(torch.tensor(values), 0),
                               rtol=1e-5, atol=1e-6)


def test_a_reduction_read_by_two_kernels_is_still_stored():
    x = Tensor(inputs((4, 10), special=False), device="CPU").realize()
    peak = x.max(-1, keepdim=True)
    items, _ = create_schedule([(x - peak).uop, (x * peak).uop], "CPU")
    assert len(items) == 3
    assert "used by 2 kernels" in items[0].boundary_reason


def test_the_limit_is_a_setting_of_the_scheduler(monkeypatch):
    x = Tensor(np.zeros((2, 64), np.float32), device="CPU").realize()
    monkeypatch.setattr(schedule_module, "MAX_FUSED_ROW_BYTES", 128)  # 32 floats
    assert len(schedule_of(x.softmax(-1))) == 3


# ---- placement: once per row, not once per element ----

def fused_program(build, shape: tuple[int, ...], options=None) -> LinearProgram:
    x = Tensor(inputs(shape, special=False), device="CPU").realize()
    (item,) = schedule_of(build(x))
    return lower(item.ast, options)


def loop_depths(program: LinearProgram) -> dict[int, int]:
    """The loop depth at each position of the program (output and reduction loops alike)."""
    depth, depths = 0, {}
    for position, u in enumerate(program.uops):
        if u.op is Ops.END_RANGE:
            depth -= 1
        depths[position] = depth
        if u.op is Ops.RANGE:
            depth += 1
    return depths


@pytest.mark.parametrize("name, reductions", [("softmax", 2), ("log_softmax", 2),
                                               ("layernorm", 2)])
def test_each_rows_reductions_are_placed_before_the_loop_over_its_outputs(name, reductions):
    """Without upcasts: loops over rows and columns, one loop per reduction, one accumulator
    each, every accumulate at depth 2 (row loop + its own), the column loop after them."""
    program = fused_program(OPS[name][0], (32, 48), NO_OPTIONS)
    ranges = [u for u in program.uops if u.op is Ops.RANGE]
    assert [u.arg[0] for u in ranges] == ["g"] + ["r"] * reductions + ["g"]
    assert sum(u.op is Ops.DEFINE_ACC for u in program.uops) == reductions
    depths = loop_depths(program)
    accumulates = [k for k, u in enumerate(program.uops) if u.op is Ops.ACCUMULATE]
    assert len(accumulates) == reductions and all(depths[k] == 2 for k in accumulates)
    column_loop = program.uops.index(ranges[-1])
    assert all(k < column_loop for k in accumulates)
    # what is computed from the row's results (1/sum, 1/sqrt(var + eps)) is per row too
    per_row = {Ops.RECIPROCAL, Ops.SQRT, Ops.LOG2}
    assert all(depths[k] == 1 for k, u in enumerate(program.uops) if u.op in per_row
               and k > accumulates[-1] and u.src and u.src[0].op is not Ops.CONST)


def test_the_c_source_computes_each_row_once_with_the_heuristics_options():
    """The heuristic's 4x4 tile and threads still apply: per iteration of the row loop, the
    max loop and the sum loop run (4 rows at once), then the column loop; `#pragma omp
    parallel for` splits the rows across cores."""
    x = Tensor(inputs((4096, 1024), special=False), device="CPU").realize()
    (item,) = schedule_of(x.softmax(-1))
    program = lower(item.ast, heuristic_plan(item.ast, 8))
    assert program.options.parallel
    source = CRenderer().render(item.name, program)
    loops = re.findall(r"for \(int (\w+) = 0; \w+ < (\d+);", source)
    assert [name for name, _ in loops] == ["gidx0", "ridx0", "ridx1", "gidx1"]
    assert source.count("#pragma omp parallel for") == 1
    assert source.index("#pragma omp parallel for") < source.index("for (int gidx0")
    rows_per_iteration = 4096 // int(loops[0][1])
    assert source.count("acc") > 0
    assert len(set(re.findall(r"float (acc\d+) =", source))) == 2 * rows_per_iteration


@pytest.mark.parametrize("name", list(OPS))
def test_fused_kernels_do_linear_work(name):
    """Work counted by running the linear program's loops: at most 4 passes over the input per
    output element (max, sum, output; layernorm: sum, sum of squares, output), at 16 and 64
    columns alike (a per-element reduction would grow with the row)."""
    for columns in (16, 64):
        program = fused_program(OPS[name][0], (8, columns), NO_OPTIONS)
        assert loads_executed(program) <= 4 * 8 * columns


def loads_executed(program: LinearProgram) -> int:
    """How many LOADs the program executes: each weighted by its enclosing loops' sizes."""
    total, sizes = 0, []
    for u in program.uops:
        if u.op is Ops.RANGE:
            sizes.append(u.arg[2])
        elif u.op is Ops.END_RANGE:
            sizes.pop()
        elif u.op is Ops.LOAD:
            total += int(np.prod(sizes, dtype=np.int64))
    return total


def test_a_regressed_placement_would_be_counted():
    """The counter itself: the same kernel with all output loops opened first (as before this
    change) executes its row loads once per output element."""
    from tinyteach.codegen import lower as lower_module
    program = fused_program(OPS["softmax"][0], (8, 64), NO_OPTIONS)
    original = lower_module._loops_of_row_reductions
    try:
        lower_module._loops_of_row_reductions = lambda *args: None
        x = Tensor(inputs((8, 64), special=False), device="CPU").realize()
        (item,) = schedule_of(x.softmax(-1))
        regressed = lower(item.ast, NO_OPTIONS)
    finally:
        lower_module._loops_of_row_reductions = original
    assert loads_executed(regressed) > 16 * loads_executed(program)


# ---- drawn by viz ----

def test_viz_schedule_draws_one_kernel_and_its_row_fusions():
    pytest.importorskip("graphviz")
    import viz
    x = Tensor(inputs((3, 5), special=False), device="CPU").realize()
    figure = viz.schedule(x.softmax(1))
    assert "schedule: 1 kernel" in figure.text
    assert "the max over each row (axes (1,)) is computed in the same kernel" in figure.text
    assert "the sum over each row (axes (1,)) is computed in the same kernel" in figure.text


def test_other_kernels_open_every_output_loop_first():
    """A matmul whose rows are one upcast tile (4 rows, upcast by 4: a loop of one iteration,
    which the index simplifier drops) keeps the usual placement: all output loops, then the
    reduction inside them."""
    from tinyteach.codegen.plan import KernelOptions
    a = Tensor(inputs((4, 64), special=False), device="CPU").realize()
    b = Tensor(inputs((64, 8), special=False), device="CPU").realize()
    (item,) = schedule_of(a @ b)
    program = lower(item.ast, KernelOptions(upcasts=((0, 4),)))
    uops = program.uops
    output_loops = [k for k, u in enumerate(uops) if u.op is Ops.RANGE and u.arg[0] == "g"]
    first_accumulator = next(k for k, u in enumerate(uops) if u.op is Ops.DEFINE_ACC)
    assert len(output_loops) == 2 and max(output_loops) < first_accumulator


def test_the_schedulers_gpu_row_limit_is_the_optimizers():
    """engine/schedule.py cannot import opt/ (a layer above it), so it keeps its own copy."""
    from tinyteach.codegen import plan
    assert schedule_module.MAX_GROUP_ROW == plan.MAX_GROUP_ROW


def test_a_row_kernel_is_threaded_by_its_work_per_output():
    """A row kernel's work is its outputs times its ops per output (each output reads its row
    in every pass). Counted as outputs times the sum's length per output (1 for a softmax,
    whose sum is as long as its output row), attention's masked softmax (16 x 4 heads x 64 x
    64, ~20 ops each) stayed on one core; a small one still does."""
    scores = Tensor(inputs((16, 4, 64, 64), special=False), device="CPU")
    mask = Tensor.ones(64, 64, dtype="bool").tril()
    masked = (scores / 8).masked_fill(mask.logical_not(), float("-inf"))
    (item,) = [i for i in schedule_of(masked.softmax(-1)) if i.name.startswith("r_16_4_64_64")]
    assert lower(item.ast, heuristic_plan(item.ast, 8)).options.parallel
    (small,) = schedule_of(Tensor(inputs((4, 64), special=False), device="CPU").softmax(-1))
    assert not lower(small.ast, heuristic_plan(small.ast, 8)).options.parallel
