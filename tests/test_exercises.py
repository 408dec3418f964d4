"""The exercises: the grader on the reference solutions (pass), on broken and stubbed backends
(fail / not implemented, with input, expected, received and hint), student devices, the
student version of the notebook (with our markers and, where installed, with nbgrader), and the
command line."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tinyteach import Tensor
from tinyteach.device import Device
from tinyteach.exercises import CODEGEN_OPS, INTERPRETER_OPS, grade
from tinyteach.exercises.autograder import notebook_namespace
from tinyteach.exercises.cases import CASES, HINTS
from tinyteach.exercises.reference import reference_codegen, reference_interpreter
from tinyteach.exercises.student_version import strip_solutions, write_student_version
from tinyteach.uop import ALU, PRIMITIVE_OPS, Ops

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "chapters" / "12_exercise_backend.ipynb"


def rows_by_name(report):
    return {row.name: row for row in report.rows}


def test_the_exercises_cover_the_pinned_op_set():
    assert set(INTERPRETER_OPS) == set(PRIMITIVE_OPS) - {Ops.BUFFER, Ops.COPY}
    assert len(INTERPRETER_OPS) == len(PRIMITIVE_OPS) - 2 == 26
    assert CODEGEN_OPS == ALU and len(CODEGEN_OPS) == 18
    assert set(CASES) == set(HINTS) == set(INTERPRETER_OPS)
    assert all(case.node.op is op for op, cases in CASES.items() for case in cases)


def test_reference_solutions_pass():
    for backend in (reference_interpreter(), reference_codegen()):
        report = grade(backend)
        assert report.passed, str(report)
        assert report.count("pass") == len(report.rows)


def test_a_wrong_op_fails_with_input_expected_received_and_hint():
    backend = reference_interpreter()
    backend.ops[Ops.IDIV] = lambda node, a, b: a // np.where(b == 0, 1, b)  # floors, as Python
    backend.ops[Ops.REDUCE_AXIS] = lambda node, a: np.sum(a, axis=node.arg[1])  # drops the axis
    report = grade(backend)
    rows = rows_by_name(report)
    assert rows["IDIV"].status == "fail" and rows["REDUCE_AXIS"].status == "fail"
    assert rows["ADD"].status == "pass"  # one bug never hides another op
    text = str(report)
    assert "truncates toward zero" in text and "keepdims" in text
    expected = np.array([7, -7, 7, -7, 5, -2**31, 0]) // np.array([2, 2, -2, -2, 1, -1, 3])
    assert f"received: [ 3, {expected[1]}," in text  # Python's floor: -7 // 2 is -4
    assert "expected: [ 3, -3, -3, 3, 0, -2147483648, 0] (int32)" in text
    html = report._repr_html_()
    assert "<table>" in html and "truncates toward zero" in html and "not implemented" in html
    assert rows["fusion: softmax of a matmul, padded, flipped, permuted"].status == "skipped"


def test_missing_and_stubbed_ops_are_not_implemented():
    backend = reference_interpreter()
    del backend.ops[Ops.FLIP]

    def sin(node, a):
        raise NotImplementedError()
    backend.ops[Ops.SIN] = sin
    rows = rows_by_name(grade(backend))
    assert rows["FLIP"].status == rows["SIN"].status == "not implemented"
    assert rows["FLIP"].failure is None


def test_codegen_errors_are_reported_not_fatal():
    backend = reference_codegen()
    backend.code_for_op[Ops.IDIV] = lambda a, b, dtype: f"({a}/{b})"  # traps on x/0 in C
    backend.code_for_op[Ops.ADD] = lambda a, b, dtype: f"({a}+{b}"    # does not compile
    backend.code_for_op[Ops.MAX] = lambda a, b, dtype: f"({a}>{b}?{a}:{b})"  # loses NaN in a
    rows = rows_by_name(grade(backend))
    assert "SIGFPE" in rows["IDIV"].failure.received
    assert "CompileError" in rows["ADD"].failure.received
    assert rows["MAX"].status == "fail" and "NaN" in rows["MAX"].hint
    assert rows["MUL"].status == "pass"


def test_student_device_runs_tensors_and_re_registering_recomputes():
    backend = reference_interpreter()
    name = backend.register("STUDENT_TEST")
    a = Tensor([[1.0, 2.0], [3.0, 4.0]], device=name)
    assert np.allclose((a @ a).numpy(), [[7, 10], [15, 22]])
    broken = reference_interpreter()
    broken.ops[Ops.ADD] = lambda node, x, y: np.subtract(x, y)
    broken.register("student_test")
    b = Tensor([1.0, 2.0], device=name)
    assert (b + b).tolist() == [0.0, 0.0]  # the new table runs, not a cached kernel
    with pytest.raises(ValueError, match="built-in"):
        Device.register("CPU", lambda: None)
    with pytest.raises(ValueError, match="unknown device"):
        Tensor([1.0], device="NOT_A_DEVICE")


def test_training_with_the_reference_reaches_the_reference_accuracy():
    report = grade(reference_interpreter(), train=True)
    row = report.rows[-1]
    assert row.name.startswith("train digits") and row.status == "pass", str(report)
    assert "accuracy" in row.note


def test_strip_solutions_keeps_indentation():
    source = "class P:\n    def f(self):\n        ### BEGIN SOLUTION\n        return 1\n" \
             "        ### END SOLUTION\n    x = 2"
    assert strip_solutions(source) == ("class P:\n    def f(self):\n        # YOUR CODE HERE\n"
                                       "        raise NotImplementedError()\n    x = 2")
    with pytest.raises(ValueError):
        strip_solutions("### BEGIN SOLUTION\nreturn 1")


def backends_of(notebook: Path):
    namespace = notebook_namespace(notebook)
    return namespace["StudentInterpreter"], namespace["StudentCompiled"]


def assert_stubs_not_implemented(notebook: Path) -> None:
    interpreter, compiled = backends_of(notebook)
    report_a, report_b = grade(interpreter), grade(compiled)
    assert report_a.count("not implemented") == len(INTERPRETER_OPS), str(report_a)
    assert report_b.count("not implemented") == len(CODEGEN_OPS) + 2, str(report_b)  # + glue
    assert rows_by_name(report_b)["Program"].status == "not implemented"
    assert report_a.count("pass") == report_b.count("pass") == 0


def test_notebook_solutions_pass_and_student_version_stubs_are_not_implemented(tmp_path):
    interpreter, compiled = backends_of(NOTEBOOK)
    assert grade(interpreter).passed and grade(compiled).passed
    student = write_student_version(NOTEBOOK, tmp_path)
    cells = json.loads(student.read_text())["cells"]
    assert all(cell.get("outputs", []) == [] for cell in cells)
    assert not any("np.fmod" in "".join(cell["source"]) for cell in cells if
                   cell["cell_type"] == "code")
    assert_stubs_not_implemented(student)


def test_nbgrader_generates_the_same_student_version(tmp_path):
    nbgrader = shutil.which("nbgrader")
    if nbgrader is None:
        pytest.skip("nbgrader is not installed (pip install nbgrader); the marker test above "
                    "covers the same transformation")
    source = tmp_path / "source" / "backend"
    source.mkdir(parents=True)
    shutil.copy(NOTEBOOK, source)
    result = subprocess.run([nbgrader, "generate_assignment", "backend", "--force",
                             f"--CourseDirectory.root={tmp_path}"], capture_output=True,
                            text=True, cwd=tmp_path, timeout=120)
    released = tmp_path / "release" / "backend" / NOTEBOOK.name
    assert released.exists(), result.stdout + result.stderr
    ours = write_student_version(NOTEBOOK, tmp_path / "ours")
    sources = [["".join(c["source"]) for c in json.loads(path.read_text())["cells"]]
               for path in (released, ours)]
    assert sources[0] == sources[1]
    assert_stubs_not_implemented(released)


def test_command_line_grades_a_module_and_a_student_notebook(tmp_path):
    command = [sys.executable, "-m", "tinyteach.exercises"]
    passing = subprocess.run([*command, "tinyteach.exercises.reference"], capture_output=True,
                             text=True, cwd=ROOT, timeout=120)
    assert passing.returncode == 0, passing.stdout + passing.stderr
    assert "28 of 28 pass" in passing.stdout and "RuntimeWarning" not in passing.stderr
    student = write_student_version(NOTEBOOK, tmp_path)
    failing = subprocess.run([*command, str(student)], capture_output=True, text=True,
                             cwd=ROOT, timeout=120)
    assert failing.returncode == 1 and "26 not implemented" in failing.stdout


def test_no_submodule_shadows_an_exported_name():
    # importing a submodule sets it as an attribute of the package: a submodule named `grade`
    # (the command line used to be one) would replace the function `grade` once imported
    import importlib
    import pkgutil

    import tinyteach.exercises as package
    submodules = [info.name for info in pkgutil.iter_modules(package.__path__)]
    assert set(submodules).isdisjoint(package.__all__)
    for name in submodules:
        importlib.import_module(f"{package.__name__}.{name}")
    assert callable(package.grade) and package.grade.__module__.endswith("autograder")


def test_console_script_is_declared():
    assert 'tinyteach-grade = "tinyteach.exercises.autograder:main"' in \
        (ROOT / "pyproject.toml").read_text()
