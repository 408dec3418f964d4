"""Chapter 8c's GPU puzzles: the notebook's solutions pass the grader and its student copy does
not (in Python and through `python -m tinyteach.exercises`); kernels with a race, an access out
of bounds, a divergent barrier, a write race on global memory, too many reads or wrong values
fail with a report that names the thread; the kernel builder refuses what it cannot build."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tinyteach.exercises import grade
from tinyteach.exercises.autograder import find_backends, notebook_namespace
from tinyteach.exercises.gpu_puzzles import (
    PUZZLES,
    PuzzleError,
    PuzzleKernel,
    grade_puzzles,
    run_puzzle,
    solves,
)
from tinyteach.exercises.student_version import has_solution, student_text
from tinyteach.runtime.python import (
    BarrierDivergenceError,
    OutOfBoundsError,
    SharedMemoryRaceError,
)

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "chapters" / "08c_gpu_puzzles.ipynb"
STUDENT_COPY = ROOT / "exercises" / "08c_gpu_puzzles_student.ipynb"


def kernels_of(notebook: Path) -> list[PuzzleKernel]:
    found = find_backends(notebook_namespace(notebook)).values()
    return [kernel for kernel in found if isinstance(kernel, PuzzleKernel)]


def only_row(kernel: PuzzleKernel):
    report = grade_puzzles([kernel])
    assert not report.passed
    (row,) = report.rows
    return row, str(report)


# ---- the notebook and its student copy ----

def test_the_notebooks_solutions_pass_every_puzzle():
    kernels = kernels_of(NOTEBOOK)
    assert sorted(kernel.puzzle for kernel in kernels) == sorted(PUZZLES)
    report = grade_puzzles(kernels)
    assert report.passed, str(report)
    assert report.count("pass") == len(PUZZLES) == 7


def test_the_committed_student_copy_is_current_and_holds_no_solution():
    assert STUDENT_COPY.read_text(encoding="utf-8") == student_text(NOTEBOOK), \
        "run `make student-copy`"
    cells = json.loads(STUDENT_COPY.read_text(encoding="utf-8"))["cells"]
    assert not any(has_solution(cell) for cell in cells)
    assert sum("raise NotImplementedError()" in "".join(cell["source"]) for cell in cells
               if cell["cell_type"] == "code") == 7
    assert all(cell.get("outputs", []) == [] for cell in cells)


def test_the_student_copy_grades_as_not_implemented():
    kernels = kernels_of(STUDENT_COPY)
    assert sorted(kernel.puzzle for kernel in kernels) == sorted(PUZZLES)
    report = grade_puzzles(kernels)
    assert not report.passed
    assert [row.status for row in report.rows] == ["not implemented"] * 7
    assert report.summary() == "GPU puzzles: 0 of 7 pass, 0 fail, 7 not implemented"


@pytest.mark.parametrize("notebook, code, words", [
    (NOTEBOOK, 0, "GPU puzzles: 7 of 7 pass, 0 fail, 0 not implemented"),
    (STUDENT_COPY, 1, "tiled matmul  not implemented  raises NotImplementedError"),
])
def test_the_command_line_grades_the_notebooks(notebook: Path, code: int, words: str):
    result = subprocess.run([sys.executable, "-m", "tinyteach.exercises", str(notebook)],
                            capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == code, result.stdout + result.stderr
    assert "=== GPU puzzles" in result.stdout and words in result.stdout


def test_grade_takes_one_puzzle_kernel():
    @solves("map")
    def add_ten(k, out, a):
        out[k.thread_id(0)] = a[k.thread_id(0)] + 10

    assert grade(add_ten).passed


# ---- what the grader catches, naming the thread ----

def test_an_access_out_of_bounds_names_the_thread():
    @solves("blocks")
    def unguarded(k, out, a):
        i = k.group_id(0) * 4 + k.thread_id(0)
        out[i] = a[i] + 10

    row, text = only_row(unguarded)
    assert row.status == "fail"
    assert "OutOfBoundsError" in text
    assert "thread (1, 0, 0) of work-group (2, 0, 0) reads a[9], but a has 9 elements" in text
    with pytest.raises(OutOfBoundsError, match=r"reads a\[9\]"):
        run_puzzle(unguarded)


def test_a_missing_barrier_is_a_race_that_names_both_threads():
    @solves("tiled matmul")
    def one_barrier(k, out, a, b):  # the next step's copies overwrite tiles still being read
        column, row = k.thread_id(0), k.thread_id(1)
        i, j = k.group_id(1) * 4 + row, k.group_id(0) * 4 + column
        a_tile, b_tile = k.shared(16), k.shared(16)
        acc = k.register(0.0)
        for step in k.loop(3):
            a_tile[row * 4 + column] = a[i * 12 + step * 4 + column]
            b_tile[row * 4 + column] = b[(step * 4 + row) * 8 + j]
            k.barrier()
            for t in k.loop(4):
                acc += a_tile[row * 4 + t] * b_tile[t * 4 + column]
        out[i * 8 + j] = acc

    row, text = only_row(one_barrier)
    assert row.status == "fail" and "SharedMemoryRaceError" in text
    assert "shared-memory race" in text
    assert "writes local0[0], which thread (3, 0, 0) read since the last barrier" in text
    with pytest.raises(SharedMemoryRaceError, match=r"thread \(0, 0, 0\) of work-group"):
        run_puzzle(one_barrier)


def test_a_barrier_only_some_threads_reach_names_one_that_never_arrives():
    @solves("prefix sum")
    def divergent(k, out, a):
        i = k.thread_id(0)
        with k.when(i >= 2):
            k.barrier()

    row, text = only_row(divergent)
    assert "BarrierDivergenceError" in text
    assert "2 never reach it, e.g. thread (0, 0, 0) of work-group (0, 0, 0)" in text
    with pytest.raises(BarrierDivergenceError):
        run_puzzle(divergent)


def test_two_threads_writing_one_global_element_is_a_race():
    @solves("block sum")
    def everyone_writes(k, out, a):
        out[k.group_id(0)] = a[k.group_id(0) * 8 + k.thread_id(0)]

    row, text = only_row(everyone_writes)
    assert row.note == "two threads write one element"
    assert "thread (1, 0, 0) of work-group (0, 0, 0) writes out[0], which thread (0, 0, 0) of " \
           "work-group (0, 0, 0) wrote too" in text


def test_a_kernel_over_its_read_budget_names_the_thread():
    @solves("block sum")
    def serial(k, out, a):  # right values, but thread 0 reads all 8 partial sums
        i, g = k.thread_id(0), k.group_id(0)
        partial = k.shared(8)
        partial[i] = a[g * 8 + i]
        k.barrier()
        total = k.register(0.0)
        for t in k.loop(8):
            total += partial[t]
        with k.when(i == 0):
            out[g] = total

    assert np.allclose(run_puzzle(serial).output, PUZZLES["block sum"].spec(
        *PUZZLES["block sum"].inputs.values()))
    row, text = only_row(serial)
    assert row.note == "too many shared reads"
    assert "expected: at most 7 per thread" in text
    assert "thread (0, 0, 0) of work-group (0, 0, 0) reads 8 elements of shared memory" in text


def test_reads_per_thread_are_counted_from_the_record():
    @solves("tiled matmul")
    def one_thread_per_output(k, out, a, b):
        column, row = k.thread_id(0), k.thread_id(1)
        i, j = k.group_id(1) * 4 + row, k.group_id(0) * 4 + column
        acc = k.register(0.0)
        for t in k.loop(12):
            acc += a[i * 12 + t] * b[t * 8 + j]
        out[i * 8 + j] = acc

    run = run_puzzle(one_thread_per_output)
    a, b = PUZZLES["tiled matmul"].inputs.values()
    np.testing.assert_allclose(run.output, a @ b)
    counts = run.trace.reads_per_thread(shared=False)
    assert len(counts) == 64 and set(counts.values()) == {2 * 12}  # a row of a, a column of b
    assert run.trace.reads_per_thread(shared=True) == {}
    assert "reads 24 elements of global memory" in only_row(one_thread_per_output)[1]


def test_an_element_nobody_writes_and_a_wrong_value_are_shown():
    @solves("guard")
    def short(k, out, a):
        i = k.thread_id(0)
        with k.when(i < 3):
            out[i] = a[i] + 10

    @solves("guard")
    def plus_eleven(k, out, a):
        i = k.thread_id(0)
        with k.when(i < 4):
            out[i] = a[i] + 11

    assert "out[3] was never written" in only_row(short)[1]
    assert "out[0] is 11, not 10" in only_row(plus_eleven)[1]


# ---- the builder refuses what it cannot build, and says what to write ----

def test_pythons_if_on_a_threads_value_is_refused():
    @solves("map")
    def with_if(k, out, a):
        i = k.thread_id(0)
        if i < 4:
            out[i] = a[i]

    row, text = only_row(with_if)
    assert row.note == "the kernel could not be built"
    assert "with k.when(condition)" in text


@pytest.mark.parametrize("body, words", [
    ("out[0, 1] = a[0]", "memory is flat: write out[row * width + column]"),
    ("out[k.thread_id(0)] = a[k.thread_id(0)] < 2", "cannot combine a bool"),
    ("k.thread_id(1)", "there is no dimension 1"),
    ("k.loop(k.thread_id(0))", "k.loop(steps) takes a number of steps"),
    ("k.shared(k.thread_id(0))", "k.shared(size) takes a number of elements"),
    ("k.when(3)", "a condition is a comparison of thread values"),
    ("a[a[0]]", "the index of a is a float32"),
])
def test_kernels_the_builder_refuses(body: str, words: str):
    namespace: dict = {}
    exec(f"def kernel(k, out, a):\n    {body}\n", namespace)
    with pytest.raises(PuzzleError, match=re.escape(words)):
        run_puzzle(PuzzleKernel("map", namespace["kernel"]))


def test_a_loop_left_early_is_refused():
    @solves("map")
    def breaks(k, out, a):
        for _ in k.loop(2):
            break

    with pytest.raises(PuzzleError, match="left early"):
        run_puzzle(breaks)


def test_an_unknown_puzzle_is_refused():
    with pytest.raises(KeyError, match="no puzzle 'mapp'"):
        solves("mapp")


def test_a_registers_value_is_the_one_where_it_is_read():
    @solves("map")
    def read_before_adding(k, out, a):
        i = k.thread_id(0)
        acc = k.register(10.0)
        before = acc + a[i]  # 10 + a[i], whatever acc becomes later
        acc += 100
        out[i] = before

    @solves("map")
    def read_after_adding(k, out, a):
        i = k.thread_id(0)
        acc = k.register(0.0)
        for _ in k.loop(5):
            acc += 2
        out[i] = acc + a[i]

    assert grade_puzzles([read_before_adding, read_after_adding]).passed
