"""The exercises: the grader on the reference solutions (pass), on broken and stubbed backends
(fail / not implemented, with input, expected, received and hint), student devices, the stretch
exercise's rewrite rules, the student version of the notebook (with our markers and, where
installed, with nbgrader), the committed student copy, and the command line."""
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
from tinyteach.exercises import CODEGEN_OPS, INTERPRETER_OPS, RULE_NAMES, RewriteRules, grade
from tinyteach.exercises.autograder import notebook_namespace
from tinyteach.exercises.cases import CASES, HINTS
from tinyteach.exercises.reference import reference_codegen, reference_interpreter, reference_rules
from tinyteach.exercises.rewrites import (
    RULE_CASES,
    RULE_HINTS,
    TOGETHER,
    TOGETHER_CASES,
    a,
    evaluate,
    i,
    inputs_of,
    mul,
)
from tinyteach.exercises.student_version import (
    MARKER_WORDS,
    STUB,
    strip_solutions,
    student_text,
    write_student_version,
)
from tinyteach.ir.rewrite import UPat, graph_rewrite, symbolic
from tinyteach.ir.uop import ALU, PRIMITIVE_OPS, Ops, UOp

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "chapters" / "12_exercise_backend.ipynb"
STUDENT_COPY = ROOT / "exercises" / "12_exercise_backend_student.ipynb"


def rows_by_name(report):
    return {row.name: row for row in report.rows}


def test_the_exercises_cover_the_pinned_op_set():
    assert set(INTERPRETER_OPS) == set(PRIMITIVE_OPS) - {Ops.BUFFER, Ops.COPY}
    assert len(INTERPRETER_OPS) == len(PRIMITIVE_OPS) - 2 == 27
    assert CODEGEN_OPS == ALU and len(CODEGEN_OPS) == 19
    assert set(CASES) == set(HINTS) == set(INTERPRETER_OPS)
    assert all(case.node.op is op for op, cases in CASES.items() for case in cases)


def test_reference_solutions_pass():
    for backend in (reference_interpreter(), reference_codegen(), reference_rules()):
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
    def divide(renderer, operands, operand_dtypes, dtype):  # traps on x/0 in C
        return "({}/{})".format(*operands)

    def add(renderer, operands, operand_dtypes, dtype):  # does not compile
        return "({}+{}".format(*operands)

    def maximum(renderer, operands, operand_dtypes, dtype):  # loses NaN in a
        a, b = operands
        return f"({a}>{b}?{a}:{b})"

    def old_style_mul(a, b, dtype):  # the contract before: (a, b, dtype)
        return f"({a}*{b})"

    backend = reference_codegen()
    backend.code_for_op.update({Ops.IDIV: divide, Ops.ADD: add, Ops.MAX: maximum,
                                Ops.MUL: old_style_mul})
    rows = rows_by_name(grade(backend))
    assert "SIGFPE" in rows["IDIV"].failure.received
    assert "CompileError" in rows["ADD"].failure.received
    assert rows["MAX"].status == "fail" and "NaN" in rows["MAX"].hint
    assert "must take (renderer, operands, operand_dtypes, dtype)" in rows["MUL"].failure.received
    assert rows["CMPLT"].status == "pass"


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
    return namespace["StudentInterpreter"], namespace["StudentCompiled"], namespace["StudentRules"]


def assert_stubs_not_implemented(notebook: Path) -> None:
    interpreter, compiled, rules = backends_of(notebook)
    report_a, report_b, report_s = grade(interpreter), grade(compiled), grade(rules)
    assert report_a.count("not implemented") == len(INTERPRETER_OPS), str(report_a)
    assert report_b.count("not implemented") == len(CODEGEN_OPS) + 2, str(report_b)  # + glue
    assert rows_by_name(report_b)["Program"].status == "not implemented"
    assert report_s.count("not implemented") == len(RULE_NAMES), str(report_s)
    assert rows_by_name(report_s)[TOGETHER].status == "skipped"
    assert report_a.count("pass") == report_b.count("pass") == report_s.count("pass") == 0


def test_notebook_solutions_pass_and_student_version_stubs_are_not_implemented(tmp_path):
    interpreter, compiled, rules = backends_of(NOTEBOOK)
    assert grade(interpreter).passed and grade(compiled).passed and grade(rules).passed
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
    assert "29 of 29 pass" in passing.stdout and "RuntimeWarning" not in passing.stderr
    assert "Stretch (rewrite rules): 6 of 6 pass" in passing.stdout
    student = write_student_version(NOTEBOOK, tmp_path)
    failing = subprocess.run([*command, str(student)], capture_output=True, text=True,
                             cwd=ROOT, timeout=120)
    assert failing.returncode == 1 and "27 not implemented" in failing.stdout
    assert "Stretch (rewrite rules): 0 of 6 pass, 0 fail, 5 not implemented" in failing.stdout


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


# ---- the committed student copy ----

def solution_lines(notebook: Path) -> list[str]:
    """Every line between BEGIN and END SOLUTION in the notebook, stripped."""
    lines, inside = [], False
    for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
        for line in "".join(cell["source"]).splitlines():
            if MARKER_WORDS[0] in line:
                inside = True
            elif MARKER_WORDS[1] in line:
                inside = False
            elif inside and line.strip():
                lines.append(line.strip())
    return lines


def test_the_committed_student_copy_is_generated_from_the_current_solutions():
    assert STUDENT_COPY.exists(), "run `make student-copy`"
    committed = STUDENT_COPY.read_text(encoding="utf-8")
    assert committed == student_text(NOTEBOOK), \
        f"{STUDENT_COPY.name} is out of date with {NOTEBOOK.name}: run `make student-copy`"


def test_the_student_copy_holds_no_solution_and_a_stub_for_each():
    solution = json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]
    student = json.loads(STUDENT_COPY.read_text(encoding="utf-8"))["cells"]
    assert [cell["id"] for cell in student] == [cell["id"] for cell in solution]
    student_lines = {line.strip() for cell in student
                     for line in "".join(cell["source"]).splitlines()}
    hidden = solution_lines(NOTEBOOK)
    assert len(hidden) > 60  # the solutions of A, B and the stretch exercise
    assert [line for line in hidden if line in student_lines] == []
    markers = sum("".join(cell["source"]).count(MARKER_WORDS[0]) for cell in solution)
    code = [line.strip() for cell in student if cell["cell_type"] == "code"
            for line in "".join(cell["source"]).splitlines()]
    assert code.count(STUB[0]) == code.count(STUB[1]) == markers > 40  # one stub per solution
    assert all(code[k + 1] == STUB[1] for k, line in enumerate(code) if line == STUB[0])
    assert not any(word in line for line in code for word in MARKER_WORDS)
    for before, after in zip(solution, student):  # cells without a solution are unchanged
        if not any(word in "".join(before["source"]) for word in MARKER_WORDS):
            assert after["source"] == before["source"], before["id"]
        assert after.get("outputs", []) == [] and "execution" not in after["metadata"]


def test_the_student_copy_grades_as_not_implemented():
    assert_stubs_not_implemented(STUDENT_COPY)


def test_student_version_writes_a_named_file_and_never_its_source(tmp_path):
    target = write_student_version(NOTEBOOK, tmp_path / "copies" / "student.ipynb")
    assert target == tmp_path / "copies" / "student.ipynb"
    assert target.read_text(encoding="utf-8") == student_text(NOTEBOOK)
    with pytest.raises(ValueError, match="overwrite"):
        write_student_version(NOTEBOOK, NOTEBOOK.parent)


# ---- the stretch exercise: rewrite rules ----

def rule_row(rules: RewriteRules, name: str):
    return rows_by_name(grade(rules))[name]


def test_rule_cases_cover_the_rules_and_the_default_simplifier_lacks_them():
    assert set(RULE_CASES) == set(RULE_HINTS) == set(RULE_NAMES) and len(RULE_NAMES) == 5
    for cases in RULE_CASES.values():
        assert any(case.expected is not None for case in cases)
        for case in cases:  # symbolic leaves every graph as it is: these rules are new
            assert graph_rewrite(case.graph, symbolic) is case.graph, case.label


def test_the_evaluator_computes_what_numpy_computes():
    inputs = inputs_of(mul(a, 2.0) + (-a))
    values = inputs[a]
    assert np.isnan(values).any() and np.isinf(values).any() and np.signbit(values).any()
    with np.errstate(all="ignore"):
        expected = values * np.float32(2) + np.negative(values)
    assert np.array_equal(evaluate(mul(a, 2.0) + (-a), inputs), expected, equal_nan=True)
    integers = inputs_of(mul(i, -1))[i]
    assert integers.min() == -2**31 and integers.dtype == np.int32
    assert np.array_equal(evaluate(mul(i, -1), {i: integers}), integers * np.int32(-1))


def test_every_expected_form_keeps_the_value_and_is_smaller():
    for case in [*TOGETHER_CASES, *(c for cases in RULE_CASES.values() for c in cases)]:
        if case.expected is None:
            continue
        inputs = inputs_of(case.graph)
        before, after = evaluate(case.graph, inputs), evaluate(case.expected, inputs)
        assert before.dtype == after.dtype
        assert np.array_equal(before, after, equal_nan=True), case.label
        if before.dtype.kind == "f":  # -0.0 stays -0.0 (a NaN's sign bit means nothing)
            numbers = ~np.isnan(before)
            assert np.array_equal(np.signbit(before[numbers]), np.signbit(after[numbers]))
        assert len(case.expected.toposort) < len(case.graph.toposort), case.label


def test_a_rule_that_changes_the_value_fails_with_the_input_and_a_hint():
    rules = reference_rules()
    any_dtype = lambda: (UPat(Ops.ADD, src=(UPat.var("x"), UPat(Ops.NEG, src=(UPat.var("x"),)))),  # noqa: E731
                         lambda x: UOp.const(x.dtype, 0))
    rules.rules["x+(-x) -> 0 (ints)"] = any_dtype
    row = rule_row(rules, "x+(-x) -> 0 (ints)")
    assert row.status == "fail" and row.note == "changes the value"
    assert "inf-inf is NaN" in row.failure.case
    assert "a = inf (float32)" in row.failure.inputs  # the first input where the value changes
    with np.errstate(invalid="ignore"):
        assert np.isnan(np.float32(np.inf) - np.float32(np.inf))
    assert row.failure.expected == "nan (float32)" and row.failure.received == "0. (float32)"
    assert "inf + -inf" in row.hint
    assert rule_row(rules, "x*2 -> x+x").status == "pass"  # one bug never hides another rule


def test_wrong_rules_fail_with_a_reason():
    rules = reference_rules()
    x = UPat.var("x")
    rules.rules["x*2 -> x+x"] = lambda: (UPat(Ops.MUL, src=(x, UPat.cvar("k"))), lambda x, k: x + x)
    rules.rules["x*-1 -> -x"] = lambda: (UPat(Ops.MUL, src=(x, UPat.const(-1))),
                                         lambda x: UOp.const(x.dtype, 0) + (-x))
    rules.rules["where(c, x, x) -> x"] = lambda: (UPat(Ops.WHERE, src=(UPat.var("c"), x, x)),
                                                  lambda c, x: x * 1)
    rules.rules["x!=x -> False (not floats)"] = lambda: "x != x"
    rows = rows_by_name(grade(rules))
    assert "x*3 stays as it is" in rows["x*2 -> x+x"].failure.case
    assert rows["x*-1 -> -x"].failure.expected == "-0. (float32)"  # 0.0*-1, but 0.0-0.0 is 0.0
    assert rows["where(c, x, x) -> x"].note == "not the expected graph"
    assert rows["where(c, x, x) -> x"].failure.received == "(a*1.0)"
    assert rows["x!=x -> False (not floats)"].note == "not a rule"
    not_a_rule = rows["x!=x -> False (not floats)"].failure
    assert "must return (UPat, build function)" in not_a_rule.received
    assert rows[TOGETHER].status == "skipped"


def test_a_rule_that_never_finishes_is_a_failure_not_a_hang():
    rules = reference_rules()
    grows = lambda: (UPat(Ops.MUL, src=(UPat.var("x"), UPat.const(2))), lambda x: (x + x) * 2)  # noqa: E731
    rules.rules["x*2 -> x+x"] = grows
    row = rule_row(rules, "x*2 -> x+x")
    assert row.status == "fail" and "did not finish" in row.failure.received


def test_missing_and_stubbed_rules_are_not_implemented_and_names_are_checked():
    rules = reference_rules()
    del rules.rules["x*2 -> x+x"]

    def stub():
        raise NotImplementedError()
    rules.rules["where(c, x, x) -> x"] = stub
    rows = rows_by_name(grade(rules))
    assert rows["x*2 -> x+x"].status == rows["where(c, x, x) -> x"].status == "not implemented"
    assert rows["x*-1 -> -x"].status == "pass" and rows[TOGETHER].status == "skipped"
    assert rules.missing() == ["x*2 -> x+x"]
    with pytest.raises(ValueError, match="unknown rule name"):
        RewriteRules({"x*4 -> x<<2": stub})
    with pytest.raises(TypeError, match="RewriteRules"):
        grade({"x*2 -> x+x": stub})
