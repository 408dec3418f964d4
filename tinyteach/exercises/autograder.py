"""Chapter 12 (grader): each op of a student backend, alone, on edge cases; then the whole stack.

What this teaches:
- `grade(backend)` runs every case of cases.py and gives one row per op: pass, fail or not
  implemented (the op is missing or raises NotImplementedError). A failure shows the input, the
  expected value (from the reference, runtime/numpy.py) and the received one, plus a hint;
- an interpreter backend (Exercise A) is graded by calling each op function directly; a
  code-generating one (Exercise B) by rendering, compiling and running one small kernel per case,
  with the CPU device's compiler, while its own Compiler and Program are graded on a kernel the
  reference renderer wrote — so a bug in one part never hides the others;
- when every op passes, the backend runs real programs as a device: a fused softmax of a
  matmul, a TinyJit replay, and with `train=True` a digits classifier (an MLP trained with Adam)
  that must reach the reference accuracy within one percentage point;
- the stretch exercise's rewrite rules (rewrites.py) are graded the same way: one row per rule,
  pass, fail or not implemented, with the graph, the expected and the received result and a hint;
- chapter 8c's GPU puzzle kernels (`@solves`, gpu_puzzles.py) are found by the same command line
  and graded together, one row per puzzle.

Everything runs offline. From a terminal: `python -m tinyteach.exercises <module or file>`
(a module name, a .py file or an .ipynb notebook; __main__.py is that command line, and
`tinyteach-grade` the same as a console script) grades every backend the file defines.

Builds on: exercises/cases.py, interpreter.py, codegen.py, rewrites.py, report.py; tensor,
jit, nn.
Used by: chapters/12_exercise_backend.ipynb.

>>> from tinyteach.exercises.reference import reference_interpreter
>>> report = grade(reference_interpreter())
>>> report.passed, report.count("pass")
(True, 28)
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import multiprocessing
import runpy
import signal
from collections.abc import Callable, Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from tinyteach.device import CompileError, Device
from tinyteach.engine.jit import TinyJit
from tinyteach.exercises.cases import CASES, HINTS, Case
from tinyteach.exercises.codegen import CODEGEN_OPS, CodegenBackend, StudentRenderer
from tinyteach.exercises.gpu_puzzles import PuzzleKernel, grade_puzzles
from tinyteach.exercises.interpreter import INTERPRETER_OPS, InterpreterBackend
from tinyteach.exercises.report import (
    FAIL,
    NOT_IMPLEMENTED,
    PASS,
    SKIPPED,
    Failure,
    GradeReport,
    Row,
    show,
)
from tinyteach.exercises.rewrites import RewriteRules, grade_rules
from tinyteach.helpers import memo
from tinyteach.ir.uop import Ops
from tinyteach.runtime.cpu import CPUProgram
from tinyteach.runtime.numpy import NUMPY_OPS
from tinyteach.tensor import Tensor

StudentBackend = InterpreterBackend | CodegenBackend
Gradable = InterpreterBackend | CodegenBackend | RewriteRules | PuzzleKernel  # what grade() takes
SKIP_TAG = "skip-when-grading"  # notebook cells that use the backend instead of defining it


class NotImplementedYet(Exception):
    """A case stopped at an op the student has not written (it raised NotImplementedError)."""


# ---- comparing values ----

def engine_value(node_op: Ops, dtype: np.dtype, value: Any) -> np.ndarray:
    """What the engine keeps of an op's result: an array of the node's dtype (CAST's result is
    kept as it is, so a CAST to the wrong dtype shows)."""
    return np.asarray(value) if node_op is Ops.CAST else np.asarray(value, dtype=dtype)


def mismatch(expected: np.ndarray, received: np.ndarray) -> bool:
    if expected.shape != received.shape or expected.dtype != received.dtype:
        return True
    if expected.dtype.kind in "fc":  # float math may differ in the last bits; NaN equals NaN
        tolerance = 1e-12 if expected.dtype == np.float64 else 1e-5
        return not np.allclose(expected, received, rtol=tolerance, atol=tolerance,
                               equal_nan=True)
    return not np.array_equal(expected, received)


def describe_inputs(case: Case) -> str:
    names = "abc" if case.node.op is not Ops.WHERE else ["condition", "a", "b"]
    parts = [f"{name} = {show(x)}" for name, x in zip(names, case.inputs)]
    if case.node.arg is not None:
        parts.append(f"arg = {show_arg(case.node.arg)}")
    return ", ".join(parts)


def show_arg(arg: Any) -> str:
    """An op's arg as a student writes it: (Ops.ADD, (1,)), not (<Ops.ADD: 11>, (1,))."""
    if isinstance(arg, tuple) and arg and isinstance(arg[0], Ops):
        return f"(Ops.{arg[0].name}, {arg[1]!r})"
    return repr(arg)


def expected_value(case: Case) -> np.ndarray:
    with np.errstate(all="ignore"):
        result = NUMPY_OPS[case.node.op](case.node, *case.inputs)
    return engine_value(case.node.op, case.node.dtype.np, result)


def check_cases(op: Ops, run_case: Callable[[Case], np.ndarray]) -> Row:
    """Run every case of `op`; the row reports the first one that goes wrong."""
    for case in CASES[op]:
        expected = expected_value(case)
        try:
            received = run_case(case)
        except NotImplementedYet as error:
            return Row(op.name, NOT_IMPLEMENTED, str(error))
        except Exception as error:  # the student's code crashed: that is a failure to show
            return failed_row(op, case, expected, f"raised {type(error).__name__}: {error}")
        if mismatch(expected, received):
            return failed_row(op, case, expected, show(received))
    return Row(op.name, PASS, f"{len(CASES[op])} cases")


def failed_row(op: Ops, case: Case, expected: np.ndarray, received: str) -> Row:
    failure = Failure(case.label, describe_inputs(case), show(expected), received)
    return Row(op.name, FAIL, case.label, failure, HINTS[op])


# ---- Exercise A: call each op function directly ----

def interpreter_case_runner(ops: dict[Ops, Callable[..., Any]]) -> Callable[[Case], np.ndarray]:
    def run_case(case: Case) -> np.ndarray:
        function = ops.get(case.node.op)
        if function is None:
            raise NotImplementedYet(f"no function for {case.node.op.name} in the table")
        inputs = [x.copy() for x in case.inputs]  # a function that writes into its input
        try:
            with np.errstate(all="ignore"):
                result = function(case.node, *inputs)
        except NotImplementedError as error:
            raise NotImplementedYet(str(error) or "raises NotImplementedError") from None
        return engine_value(case.node.op, case.node.dtype.np, result)
    return run_case


def grade_interpreter_ops(backend: InterpreterBackend) -> list[Row]:
    run_case = interpreter_case_runner(backend.ops)
    return [check_cases(op, run_case) for op in INTERPRETER_OPS]


# ---- Exercise B: one small compiled kernel per case ----

def device_case_runner(device: str) -> Callable[[Case], np.ndarray]:
    """Run a case's node on `device`, its inputs brought there as buffers."""
    def run_case(case: Case) -> np.ndarray:
        sources = tuple(Tensor(x, device=device).uop for x in case.inputs)
        try:
            return Tensor(case.node.replace(src=sources), device).numpy()
        except NotImplementedError as error:
            raise NotImplementedYet(str(error) or "raises NotImplementedError") from None
    return run_case


def in_child_process(run_case: Callable[[Case], np.ndarray]) -> Callable[[Case], np.ndarray]:
    """Run each case in a forked process: C traps on an integer division by zero (SIGFPE),
    which would kill the grader (and the notebook's kernel) with it."""
    def run_isolated(case: Case) -> np.ndarray:
        context = multiprocessing.get_context("fork")
        receiver, sender = context.Pipe(duplex=False)
        child = context.Process(target=child_runs_case, args=(run_case, case, sender))
        child.start()
        sender.close()
        outcome = receive(receiver)
        child.join()
        kind, value = outcome
        if kind == "crashed" or child.exitcode:
            raise KernelCrashed(crash_message(child.exitcode))
        if kind == "not implemented":
            raise NotImplementedYet(value)
        if kind == "error":
            raise RuntimeError(value)
        return np.asarray(value)
    return run_isolated


def receive(receiver: Any) -> tuple[str, Any]:
    """The child's outcome, or ("crashed", "") when it died (or hung) before sending one."""
    try:
        if receiver.poll(120):
            outcome: tuple[str, Any] = receiver.recv()
            return outcome
    except EOFError:  # the child's end closed without a message: it crashed
        pass
    return ("crashed", "")


class KernelCrashed(RuntimeError):
    """The compiled kernel killed its process."""


def crash_message(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        return f"the kernel crashed the process with {signal.Signals(-exitcode).name}"
    return f"the kernel's process ended with exit code {exitcode}"


def child_runs_case(run_case: Callable[[Case], np.ndarray], case: Case, sender: Any) -> None:
    try:
        sender.send(("ok", run_case(case)))
    except NotImplementedYet as error:
        sender.send(("not implemented", str(error)))
    except Exception as error:  # sent to the parent, which reports it
        sender.send(("error", f"{type(error).__name__}: {error}"))


# integer division by zero and MIN/-1 trap in C: these ops run in a child process
MAY_TRAP = (Ops.IDIV, Ops.MOD)


def grade_codegen_ops(backend: CodegenBackend) -> list[Row]:
    # the student's code_for_op with the CPU device's Compiler and Program
    device = CodegenBackend(backend.code_for_op).register("GRADE_CODE_FOR_OP")
    run_case = device_case_runner(device)
    isolated = in_child_process(run_case)
    return [check_cases(op, isolated if op in MAY_TRAP else run_case) for op in CODEGEN_OPS]


def grade_glue(backend: CodegenBackend) -> list[Row]:
    """The student's Compiler and Program, on C source the reference renderer wrote."""
    from tinyteach.exercises.codegen import cpu_compiler
    from tinyteach.exercises.reference import reference_codegen

    compiler, program = backend.compiler, backend.program
    assert compiler is not None and program is not None  # with_default_glue filled them in
    reference = reference_codegen()
    renderer = StudentRenderer(reference.code_for_op)
    a, b = np.arange(4, dtype=np.float32), np.full(4, 0.5, dtype=np.float32)
    with kernel_source(renderer, a, b) as (name, source, run):
        compiler_row, binary = glue_step("Compiler", lambda: compiler.compile(source))
        if compiler_row.status != PASS:  # grade the Program on the CPU device's binary instead
            binary = cpu_compiler().compile(source)
        program_row, received = glue_step("Program", lambda: run(program(name, binary)))
    if program_row.status == PASS and mismatch(a + b, received):
        failure = Failure("runs the kernel a + b", f"a = {show(a)}, b = {show(b)}", show(a + b),
                          show(received))
        program_row = Row("Program", FAIL, "wrong result", failure,
                          "call the compiled function with each buffer's address, in order")
    return [compiler_row, program_row]


@contextlib.contextmanager
def kernel_source(renderer: StudentRenderer, a: np.ndarray,
                  b: np.ndarray) -> Iterator[tuple[str, str, Callable[[Any], np.ndarray]]]:
    """The C source of the kernel a + b, and a function that runs a program on its buffers."""
    from tinyteach.codegen.lower import lower
    from tinyteach.engine.schedule import create_schedule
    from tinyteach.opt.heuristic import heuristic_plan

    left, right = Tensor(a, device="NUMPY"), Tensor(b, device="NUMPY")
    items, _ = create_schedule([(left + right).uop], "NUMPY")
    item = items[-1]
    source = renderer.render(item.name, lower(item.ast, heuristic_plan(item.ast)))

    def run(program: Any) -> np.ndarray:
        program(*item.buffers)
        return item.output.numpy()
    yield item.name, source, run


def glue_step(name: str, step: Callable[[], Any]) -> tuple[Row, Any]:
    hint = {"Compiler": "compile(source) returns what the Program loads: reuse the CPU "
                        "device's ClangStyleCompiler(find_c_compiler()).compile(source)",
            "Program": "Program(name, binary) loads the function `name` (ctypes.CDLL) and calls "
                       "it with ctypes.c_void_p(buffer.storage.address) for each buffer"}[name]
    try:
        return Row(name, PASS), step()
    except NotImplementedError:
        return Row(name, NOT_IMPLEMENTED, "raises NotImplementedError"), None
    except (CompileError, Exception) as error:
        failure = Failure("compile and run the kernel a + b", "", "no error",
                          f"raised {type(error).__name__}: {error}")
        return Row(name, FAIL, type(error).__name__, failure, hint), None


# ---- the whole stack on the student's device ----

@contextlib.contextmanager
def default_device(name: str) -> Iterator[None]:
    """Tensors created inside (weights, constants) land on `name`."""
    previous = Device.DEFAULT
    Device.DEFAULT = name
    try:
        yield
    finally:
        Device.DEFAULT = previous


def softmax_of_matmul(device: str) -> np.ndarray:
    x = Tensor(np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4), device=device)
    w = Tensor(np.linspace(1, -1, 20, dtype=np.float32).reshape(4, 5), device=device)
    moved = (x @ w).pad(((0, 1), (1, 0))).flip(0).permute(1, 0)
    return moved.softmax(1).numpy()


def jit_replay(device: str) -> np.ndarray:
    @TinyJit
    def step(x: Tensor) -> Tensor:
        return ((x * 2 + 1).relu().sum(0) // 3).realize()

    results = [step(Tensor(np.arange(6, dtype=np.int32).reshape(2, 3) - k, device=device))
               .numpy() for k in range(4)]
    return np.stack(results)


STACK_CHECKS = {
    "fusion: softmax of a matmul, padded, flipped, permuted": softmax_of_matmul,
    "TinyJit: capture once, replay three times": jit_replay,
}


def grade_stack(device: str) -> list[Row]:
    rows = []
    for name, check in STACK_CHECKS.items():
        expected = check("NUMPY")
        try:
            with default_device(device):
                received = check(device)
        except Exception as error:  # shown in the report, as any student error
            received_text = f"raised {type(error).__name__}: {error}"
        else:
            if not mismatch(expected, received):
                rows.append(Row(name, PASS))
                continue
            received_text = show(received)
        failure = Failure(name, "", show(expected), received_text)
        rows.append(Row(name, FAIL, "", failure, "every op passed alone: look at how they combine"))
    return rows


# ---- training: the digits classifier ----

class MLP:
    """64 pixels -> 32 hidden units (relu) -> 10 classes."""

    def __init__(self) -> None:
        from tinyteach import nn

        self.hidden, self.out = nn.Linear(64, 32), nn.Linear(32, 10)

    def __call__(self, x: Tensor) -> Tensor:
        return self.out(self.hidden(x).relu())


def digits_arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from tinyteach import nn

    with default_device("NUMPY"):
        x_train, y_train, x_test, y_test = (t.numpy() for t in nn.datasets.digits())
    return x_train.reshape(-1, 64), y_train, x_test.reshape(-1, 64), y_test


def train_digits(device: str, steps: int = 300, batch_size: int = 64, seed: int = 0) -> float:
    """Train the MLP on `device` with Adam; returns the test accuracy (0..1)."""
    from tinyteach import nn
    from tinyteach.nn.state import get_parameters

    x_train, y_train, x_test, y_test = digits_arrays()
    rng = np.random.default_rng(seed)
    with default_device(device):
        Tensor.manual_seed(seed)  # the same initial weights on every device
        model = MLP()
        optimizer = nn.optim.Adam(get_parameters(model), lr=1e-2)

        @TinyJit
        def train_step(x: Tensor, y: Tensor) -> Tensor:
            with Tensor.train():
                optimizer.zero_grad()
                loss = model(x).sparse_categorical_crossentropy(y).backward()
                optimizer.step()
                return loss.realize()

        for _ in range(steps):
            chosen = rng.integers(0, len(x_train), batch_size)
            train_step(Tensor(x_train[chosen]), Tensor(y_train[chosen]))
        predictions = model(Tensor(x_test)).argmax(axis=1).numpy()
    return float((predictions == y_test).mean())


@memo("exercises.reference_accuracy")
@lru_cache(maxsize=4)
def reference_accuracy(steps: int) -> float:
    return train_digits("NUMPY", steps)


def grade_training(device: str, steps: int) -> Row:
    name = f"train digits: MLP + Adam, {steps} steps"
    reference = reference_accuracy(steps)
    try:
        accuracy = train_digits(device, steps)
    except Exception as error:  # shown in the report, as any student error
        failure = Failure(name, "", f"accuracy {reference:.1%}",
                          f"raised {type(error).__name__}: {error}")
        return Row(name, FAIL, "", failure, "run a training step by hand on your device")
    note = f"accuracy {accuracy:.1%} (reference {reference:.1%})"
    if abs(accuracy - reference) <= 0.01:
        return Row(name, PASS, note)
    failure = Failure(name, "", f"accuracy {reference:.1%} ± 1%", f"accuracy {accuracy:.1%}")
    return Row(name, FAIL, note, failure, "gradients use every op: check REDUCE_AXIS and EXPAND")


# ---- grade(): everything together ----

def grade(backend: Gradable, train: bool = False, steps: int = 300) -> GradeReport:
    """Grade a student backend (or the stretch exercise's rewrite rules); in a notebook the
    report shows as an HTML table."""
    if isinstance(backend, RewriteRules):
        return GradeReport("Stretch (rewrite rules)", grade_rules(backend))
    if isinstance(backend, PuzzleKernel):  # chapter 8c: a GPU puzzle's kernel
        return grade_puzzles([backend])
    if isinstance(backend, InterpreterBackend):
        report = GradeReport("Exercise A (interpreter)", grade_interpreter_ops(backend))
    elif isinstance(backend, CodegenBackend):
        rows = grade_codegen_ops(backend)
        if backend.compiler is not None or backend.program is not None:
            rows += grade_glue(with_default_glue(backend))
        report = GradeReport("Exercise B (code generation)", rows)
    else:
        raise TypeError(f"grade() takes an InterpreterBackend, a CodegenBackend, RewriteRules "
                        f"or a PuzzleKernel, not {type(backend).__name__}")
    report.rows += grade_whole_backend(backend, report.passed, train, steps)
    return report


def with_default_glue(backend: CodegenBackend) -> CodegenBackend:
    """The backend with the CPU device's Compiler or Program where the student gave none."""
    from tinyteach.exercises.codegen import cpu_compiler

    compiler = backend.compiler if backend.compiler is not None else cpu_compiler()
    program = backend.program if backend.program is not None else CPUProgram
    return CodegenBackend(backend.code_for_op, compiler, program)


def grade_whole_backend(backend: StudentBackend, ops_pass: bool, train: bool,
                        steps: int) -> list[Row]:
    names = [*STACK_CHECKS] + ([f"train digits: MLP + Adam, {steps} steps"] if train else [])
    if not ops_pass:
        return [Row(name, SKIPPED, "runs once every row above passes") for name in names]
    device = backend.register("GRADE_BACKEND")
    rows = grade_stack(device)
    if train:
        rows.append(grade_training(device, steps))
    return rows


# ---- the command line: python -m tinyteach.exercises <module or file> ----

def notebook_namespace(path: Path) -> dict[str, Any]:
    """Run a notebook's code cells (not those tagged skip-when-grading, no IPython magics)."""
    notebook = json.loads(path.read_text())
    namespace: dict[str, Any] = {"__name__": "__notebook__"}
    for number, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "code" or SKIP_TAG in cell.get("metadata", {}).get("tags", []):
            continue
        source = "".join(cell["source"])
        lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
        exec(compile("\n".join(lines), f"{path} cell {number}", "exec"), namespace)
    return namespace


def load_target(target: str) -> dict[str, Any]:
    path = Path(target)
    if path.suffix == ".ipynb":
        return notebook_namespace(path)
    if path.suffix == ".py":
        return runpy.run_path(str(path))
    return vars(importlib.import_module(target))


def find_backends(namespace: dict[str, Any]) -> dict[str, Gradable]:
    found: dict[str, Gradable] = {}
    for name, value in namespace.items():
        is_backend = isinstance(value, (InterpreterBackend, CodegenBackend, RewriteRules,
                                        PuzzleKernel))
        if is_backend and not name.startswith("_") and value not in found.values():
            found[name] = value
    return found


def main(arguments: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Grade the student backends a file defines.")
    parser.add_argument("target", help="a module name, a .py file or an .ipynb notebook")
    parser.add_argument("--train", action="store_true", help="also train the digits model")
    parser.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    options = parser.parse_args(arguments)
    backends = find_backends(load_target(options.target))
    if not backends:
        print(f"{options.target} defines no InterpreterBackend, CodegenBackend, RewriteRules "
              "or GPU puzzle kernel (@solves)")
        return 2
    puzzles = [backend for backend in backends.values() if isinstance(backend, PuzzleKernel)]
    reports = []
    for name, backend in backends.items():
        if isinstance(backend, PuzzleKernel):
            continue  # graded together below, one row each
        print(f"=== {name}")
        reports.append(grade(backend, options.train, options.steps))
        print(reports[-1], end="\n\n")
    if puzzles:
        print("=== GPU puzzles")
        reports.append(grade_puzzles(puzzles))
        print(reports[-1], end="\n\n")
    return 0 if all(report.passed for report in reports) else 1
