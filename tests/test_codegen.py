"""Chapters 7-8: lowering and the C source of canonical kernels, DEBUG output at each level, and
GlobalCounters."""
from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from tinyteach import Context, GlobalCounters, Tensor
from tinyteach.codegen.lower import lower
from tinyteach.device import Device
from tinyteach.engine.schedule import create_schedule
from tinyteach.ir.uop import Ops
from tinyteach.opt.heuristic import heuristic_plan


def realized(*shape: int, device: str = "CPU") -> Tensor:
    values = np.random.default_rng(sum(shape)).normal(size=shape).astype(np.float32)
    return Tensor(values, device=device).realize()


def source_of(tensor: Tensor) -> list[str]:
    """The C source of every kernel realizing `tensor` (on CPU)."""
    items, _ = create_schedule([tensor.uop], "CPU")
    renderer = Device["CPU"].renderer
    return [renderer.render(item.name, lower(item.ast, heuristic_plan(item.ast)))
            for item in items if item.kind == "kernel"]


def test_elementwise_kernel_source():
    a, b = realized(4, 8), realized(4, 8)
    (source,) = source_of((a + b) * a)
    assert re.search(r"void E_4_8\(", source)
    assert "float* restrict data0" in source
    assert "const float* restrict data1" in source and "const float* restrict data2" in source
    assert "for (int gidx0 = 0; gidx0 < 4; gidx0++)" in source
    assert "for (int gidx1 = 0; gidx1 < 8; gidx1++)" in source
    assert "data0[" in source and "ridx" not in source and "acc" not in source
    assert source.count("{") == source.count("}")


def test_reduction_kernel_source():
    a = realized(4, 8)
    (source,) = source_of(a.sum(axis=1))
    assert "void r_4_8(" in source
    assert "float acc0 = 0.0f;" in source
    assert "for (int ridx0 = 0; ridx0 < 8; ridx0++)" in source
    assert re.search(r"acc0 = \(acc0\+val0\);", source)
    assert "data0[gidx0] = acc0;" in source
    # the accumulator is declared outside the reduce loop and stored after it closes
    assert source.index("float acc0") < source.index("ridx0 = 0") < source.index("data0[gidx0]")


def test_max_reduction_starts_at_minus_infinity():
    (source,) = source_of(realized(3, 5).max(axis=1))
    assert "acc0 = -INFINITY;" in source


def test_matmul_source_is_one_loop_nest():
    (source,) = source_of(realized(4, 6) @ realized(6, 3))
    assert source.count("void ") == 1
    assert "gidx0" in source and "gidx1" in source and "ridx0 < 6" in source


def test_padded_load_is_guarded():
    a = realized(3, 4)
    (source,) = source_of(a.pad(((1, 1), (0, 2))) + 1)
    # a guarded load reads 0 outside the buffer: (cond ? data1[...] : 0.0f)
    assert re.search(r"\?data1\[[^\]]+\]:0\.0f\)", source), source


def test_constants_are_c_literals():
    a = realized(2, 2)
    (source,) = source_of(a * 0.5 + (a < 0).where(a, -float("inf")))
    assert "0.5f" in source and "-INFINITY" in source


def test_index_math_is_simplified():
    a = realized(4, 8)
    (source,) = source_of(a.reshape(32).reshape(4, 8) + 1)
    assert "/" not in source and "%" not in source   # (i*8+j)//8 -> i, and so on


def test_lowered_program_opens_and_closes_loops():
    a = realized(4, 8)
    items, _ = create_schedule([a.sum(axis=1).uop], "CPU")
    program = lower(items[0].ast, heuristic_plan(items[0].ast))
    ops = [u.op for u in program.uops]
    assert ops.count(Ops.RANGE) == ops.count(Ops.END_RANGE) == 2
    assert program.global_sizes == (4,)
    assert len(program.globals) == 2 and program.globals[0].arg[0] == 0


# ---- DEBUG output ----

def kernel_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("***")]


def fresh_computation(device: str = "CPU") -> Tensor:
    # a never-seen constant, so the kernel is new (not in the program cache)
    value = float(np.random.default_rng().integers(1, 1 << 20))
    return (realized(3, 5, device=device) * value).sum(axis=1)


def test_debug_4_prints_the_source(capsys):
    with Context(DEBUG=4):
        fresh_computation().realize()
    out = capsys.readouterr().out
    assert "void r_3_5(" in out and "acc0" in out
    assert len(kernel_lines(out)) == 1


@pytest.mark.parametrize("level", [1, 2, 3])
def test_debug_levels_add_information(capsys, level):
    with Context(DEBUG=level):
        fresh_computation().realize()
    out = capsys.readouterr().out
    (line,) = kernel_lines(out)
    memory = (3 + 3 * 5) * 4  # the float32 output and input, in bytes
    assert "CPU" in line and "r_3_5" in line and "arg  2" in line
    assert line.split("mem")[1].split()[:2] == [str(memory), "B"]
    assert ("tm " in line) == (level >= 2)
    assert ("stored because" in out) == (level >= 3)
    assert ("REDUCE_AXIS" in out) == (level >= 3)
    assert "void " not in out


def test_debug_0_prints_nothing(capsys):
    fresh_computation().realize()
    assert capsys.readouterr().out == ""


def test_debug_environment_variable():
    code = ("from tinyteach import Tensor\n"
            "import numpy as np\n"
            "a = Tensor(np.ones((3, 5), dtype=np.float32), device='CPU')\n"
            "(a * 7.25).sum(axis=1).realize()\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**_environ(), "DEBUG": "4"}, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "void r_3_5(" in result.stdout and "7.25f" in result.stdout
    assert kernel_lines(result.stdout)


def _environ() -> dict[str, str]:
    import os
    return {k: v for k, v in os.environ.items() if k not in ("DEBUG", "DEV")}


def test_context_restores_the_setting():
    from tinyteach.helpers import DEBUG
    before = DEBUG.value
    with Context(DEBUG=4):
        assert DEBUG.value == 4
    assert DEBUG.value == before
    with pytest.raises(KeyError, match="NOT_A_SETTING"):
        with Context(NOT_A_SETTING=1):
            pass


# ---- GlobalCounters ----

@pytest.mark.parametrize("device", ["NUMPY", "CPU"])
def test_global_counters(device):
    a, b = realized(4, 8, device=device), realized(4, 8, device=device)
    GlobalCounters.reset()
    assert (GlobalCounters.kernel_count, GlobalCounters.global_ops, GlobalCounters.global_mem,
            GlobalCounters.time_sum_s) == (0, 0, 0, 0.0)
    (a + b).realize()
    assert GlobalCounters.kernel_count == 1
    assert GlobalCounters.global_ops >= 32            # at least one add per element
    assert GlobalCounters.global_mem == 3 * 32 * 4    # two inputs and the output, float32
    assert GlobalCounters.time_sum_s > 0
    (a * b).sum().realize()
    assert GlobalCounters.kernel_count == 2
    assert GlobalCounters.global_ops >= 32 + 32 + 32
    GlobalCounters.reset()
    assert GlobalCounters.kernel_count == 0 and GlobalCounters.time_sum_s == 0.0


def test_debug_memory_reads_in_units():
    from tinyteach.helpers import format_bytes
    assert [format_bytes(n) for n in (0, 72, 1500, 4_194_304, 1_073_741_824)] == \
        ["0 B", "72 B", "1.50 KB", "4.19 MB", "1.07 GB"]


def test_bool_buffers_are_passed_as_bytes():
    """A bool buffer is an `unsigned char*` parameter (numpy's bool arrays hold 0/1 bytes):
    gcc finds no vector type for a `_Bool` load, so a loop reading a mask stayed scalar. A
    stored comparison and a masked sum read back as numpy computes them, NaN rows included."""
    rng = np.random.default_rng(0)
    values = rng.normal(size=(8, 64)).astype(np.float32)
    values[3, 5] = np.nan
    mask = Tensor(values > 0).realize()
    (stored,) = source_of(Tensor(values) > 0)
    assert "unsigned char* restrict data0" in stored and "bool*" not in stored
    masked = mask.where(Tensor(values), 0.0).sum(1)
    (summed,) = source_of(masked)
    assert "const unsigned char* restrict data1" in summed
    np.testing.assert_array_equal((Tensor(values) > 0).numpy(), values > 0)
    np.testing.assert_allclose(masked.numpy(), np.where(values > 0, values, 0).sum(1),
                               rtol=1e-6)
