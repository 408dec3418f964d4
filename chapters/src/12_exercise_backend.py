# %% [markdown] id="ex-title"
# # 12 · Exercise: build a backend
#
# A backend is the **29 primitive ops** of [`tinyteach/ir/uop.py`](../tinyteach/ir/uop.py) plus three small classes
# (Allocator, Compiler, Program). Everything above them — fusion, autograd, the JIT, `nn` — comes for free.
# In this chapter you build two backends yourself:
#
# - **Exercise A, an interpreter:** each op is a small numpy function (27 of them: the engine handles BUFFER and COPY).
# - **Exercise B, a code generator:** each ALU op becomes a snippet of C (`code_for_op`, 19 of them), plus the
#   Compiler/Program glue. The renderer writes the loops and the indexing; you get fusion and the JIT for free.
# - **Stretch, an optimization pass:** five rewrite rules (chapter 5's pattern matcher), such as `x*2 -> x+x`.
#
# The grader ([`tinyteach/exercises/autograder.py`](../tinyteach/exercises/autograder.py)) checks every op *on its own*, on
# edge cases (negative integers, division by zero, NaN and inf, broadcasting, padding masks), and shows the
# input, the expected and the received value with a hint. When every op passes, your backend runs a fused
# softmax, a `TinyJit` replay, and trains a digits classifier to the reference accuracy.
#
# The chapter's notebook, `chapters/12_exercise_backend.ipynb`, holds the instructor's solutions between nbgrader's
# solution markers. Students work in the student copy, `exercises/12_exercise_backend_student.ipynb`, generated
# from it: there every solution is `raise NotImplementedError()`. Complete those functions, then run the grading
# cells. From a terminal: `python -m tinyteach.exercises exercises/12_exercise_backend_student.ipynb`.
# The solutions are the reference devices: [`runtime/numpy.py`](../tinyteach/runtime/numpy.py) (A) and
# [`render/c.py`](../tinyteach/render/c.py) with [`runtime/cpu.py`](../tinyteach/runtime/cpu.py) (B), and
# [`exercises/reference.py`](../tinyteach/exercises/reference.py) for the stretch — try not to peek.

# %% id="ex-setup"
import ctypes

import numpy as np

from tinyteach import Device, Tensor
from tinyteach.dtype import DType, dtypes
from tinyteach.exercises import (
    CODEGEN_OPS,
    INTERPRETER_OPS,
    CodegenBackend,
    InterpreterBackend,
    grade,
)
from tinyteach.ir.uop import Ops, UOp, is_bitcast

Device.DEFAULT = "CPU"
print(len(INTERPRETER_OPS), "ops for exercise A:", ", ".join(op.name for op in INTERPRETER_OPS))
print(len(CODEGEN_OPS), "ops for exercise B:", ", ".join(op.name for op in CODEGEN_OPS))

# %% [markdown] id="ex-a-intro"
# ## Exercise A: an interpreter backend
#
# Each op is a function `op_function(node, *sources)`: `node` is the UOp being computed (its `dtype`, and its
# `arg` for movement and reduce ops), and `sources` are the numpy arrays its sources evaluated to. It returns a
# numpy array. Here is a node the grader could hand you — a PAD of a 2×3 float32 input:

# %% id="ex-a-node"
source = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), (1, 6)).reshape((2, 3))
node = source.pad(((0, 1), (1, 0)))
print(node.op, node.dtype, node.dtype.np, node.arg, node.shape)


# %% [markdown] id="ex-a-rules"
# The semantics are tinyteach's, and every backend must give the same results: integer division truncates
# toward zero, the remainder takes the dividend's sign, dividing by zero gives 0, integers wrap around on
# overflow, and NaN and inf are values, not errors (the engine silences numpy's warnings for you).
#
# These are not C's rules, although they look like them. In C, signed overflow, integer division by zero (and
# `INT_MIN / -1`) and casting a float to an integer type that cannot hold its value are *undefined behaviour*:
# the compiler may assume they never happen, and anything may follow. The C backends make tinyteach's rules
# real: the CPU device compiles with `-fwrapv` (signed arithmetic wraps, as two's complement), and the
# generated code guards division (`b==0 ? 0 : a/b`; you will write those guards in B2). An out-of-range
# float→int cast has no guard and stays undefined (an x86 CPU returns the lowest integer), so no test relies on
# it.
#
# **A1.** Constants, the unary ops and CAST.

# %% id="ex-a1" nbgrader={"grade": false, "grade_id": "ex-a1", "locked": false, "schema_version": 3, "solution": true, "task": false}
def const(node: UOp) -> np.ndarray:
    ### BEGIN SOLUTION
    return np.array(node.arg, dtype=node.dtype.np)
    ### END SOLUTION


def neg(node: UOp, a: np.ndarray) -> np.ndarray:
    ### BEGIN SOLUTION
    return np.logical_not(a) if a.dtype == np.bool_ else np.negative(a)
    ### END SOLUTION


def exp2(node: UOp, a: np.ndarray) -> np.ndarray:
    ### BEGIN SOLUTION
    return np.exp2(a)
    ### END SOLUTION


def log2(node: UOp, a: np.ndarray) -> np.ndarray:
    ### BEGIN SOLUTION
    return np.log2(a)
    ### END SOLUTION


def sin(node: UOp, a: np.ndarray) -> np.ndarray:
    ### BEGIN SOLUTION
    return np.sin(a)
    ### END SOLUTION


def sqrt(node: UOp, a: np.ndarray) -> np.ndarray:
    ### BEGIN SOLUTION
    return np.sqrt(a)
    ### END SOLUTION


def reciprocal(node: UOp, a: np.ndarray) -> np.ndarray:
    ### BEGIN SOLUTION
    return np.divide(np.ones_like(a), a)
    ### END SOLUTION


def cast(node: UOp, a: np.ndarray) -> np.ndarray:
    ### BEGIN SOLUTION
    if is_bitcast(node):
        return a.view(node.dtype.np)
    if node.dtype == dtypes.bool:
        return a != 0
    return a.astype(node.dtype.np)
    ### END SOLUTION


# %% [markdown] id="ex-a1-hint"
# <details><summary>Hints for A1 (click to open)</summary>
#
# - NEG of a bool is logical not: `-True` is not a bool.
# - `1/0` is `inf` and `1/-0.0` is `-inf`; `np.divide` gets both right.
# - CAST must return an array of `node.dtype.np`; anything → bool is `x != 0` (NaN counts as true).
# - A CAST whose arg is `BITCAST` (`is_bitcast(node)`) keeps the bits and reads them as the new dtype:
#   `a.view(node.dtype.np)`. `Tensor.rand` makes its floats so (chapter 1), so training needs it.
# </details>

# %% [markdown] id="ex-a2-intro"
# **A2.** The binary ops. The operands have the same shape and dtype; comparisons return bools.

# %% id="ex-a2" nbgrader={"grade": false, "grade_id": "ex-a2", "locked": false, "schema_version": 3, "solution": true, "task": false}
def add(node: UOp, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    ### BEGIN SOLUTION
    return np.add(a, b, dtype=a.dtype)
    ### END SOLUTION


def mul(node: UOp, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    ### BEGIN SOLUTION
    return np.multiply(a, b, dtype=a.dtype)
    ### END SOLUTION


def idiv(node: UOp, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    ### BEGIN SOLUTION
    safe = np.where(b == 0, 1, b).astype(a.dtype)
    remainder = np.fmod(a, safe)
    quotient = np.floor_divide(a - remainder, safe)  # exact: a - remainder is a multiple of b
    return np.where(b == 0, 0, quotient).astype(a.dtype)
    ### END SOLUTION


def fdiv(node: UOp, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    ### BEGIN SOLUTION
    return np.divide(a, b, dtype=a.dtype)
    ### END SOLUTION


def mod(node: UOp, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    ### BEGIN SOLUTION
    safe = np.where(b == 0, 1, b)
    return np.where(b == 0, 0, np.fmod(a, safe)).astype(a.dtype)
    ### END SOLUTION


def maximum(node: UOp, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    ### BEGIN SOLUTION
    return np.maximum(a, b)
    ### END SOLUTION


def cmplt(node: UOp, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    ### BEGIN SOLUTION
    return np.less(a, b)
    ### END SOLUTION


def cmpne(node: UOp, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    ### BEGIN SOLUTION
    return np.not_equal(a, b)
    ### END SOLUTION


def bitwise_and(node: UOp, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    ### BEGIN SOLUTION
    return np.bitwise_and(a, b)
    ### END SOLUTION


def bitwise_or(node: UOp, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    ### BEGIN SOLUTION
    return np.bitwise_or(a, b)
    ### END SOLUTION


def bitwise_xor(node: UOp, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    ### BEGIN SOLUTION
    return np.bitwise_xor(a, b)
    ### END SOLUTION


# %% [markdown] id="ex-a2-hint"
# <details><summary>Hints for A2 (click to open)</summary>
#
# - IDIV truncates toward zero as C does: `-7 / 2` is `-3`, while Python's and numpy's `//` give `-4`.
#   `np.fmod` has C's sign rule; `a - fmod(a, b)` is an exact multiple of `b`.
# - Dividing by zero gives 0 (replace the zeros first, then put 0 back with `np.where`), and `MIN / -1` wraps to MIN.
# - FDIV is the float division, rounded once as IEEE 754 says: `x/0` is ±inf and `0/0` NaN, values, not errors.
# - MAX: NaN wins on either side — `np.maximum` does that, Python's `max` does not.
# </details>

# %% [markdown] id="ex-a3-intro"
# **A3.** WHERE, the reduction and the six movement ops. `REDUCE_AXIS`'s arg is `(Ops.ADD or Ops.MAX, axes)`
# and the reduced axes stay, with size 1. Movement ops take their new shape, order, padding, bounds or axes
# from `node.arg`.

# %% id="ex-a3" nbgrader={"grade": false, "grade_id": "ex-a3", "locked": false, "schema_version": 3, "solution": true, "task": false}
def where(node: UOp, condition: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    ### BEGIN SOLUTION
    return np.where(condition, a, b)
    ### END SOLUTION


def reduce_axis(node: UOp, a: np.ndarray) -> np.ndarray:
    op, axes = node.arg
    ### BEGIN SOLUTION
    if op is Ops.ADD:
        return np.sum(a, axis=axes, keepdims=True, dtype=a.dtype)
    if a.size == 0:  # the max of nothing: the smallest value of the dtype
        lowest = -np.inf if a.dtype.kind == "f" else np.iinfo(a.dtype).min
        return np.full(node.shape, lowest, dtype=a.dtype)
    return np.max(a, axis=axes, keepdims=True)
    ### END SOLUTION


def reshape(node: UOp, a: np.ndarray) -> np.ndarray:
    ### BEGIN SOLUTION
    return np.reshape(a, node.arg)
    ### END SOLUTION


def permute(node: UOp, a: np.ndarray) -> np.ndarray:
    ### BEGIN SOLUTION
    return np.transpose(a, node.arg)
    ### END SOLUTION


def expand(node: UOp, a: np.ndarray) -> np.ndarray:
    ### BEGIN SOLUTION
    return np.broadcast_to(a, node.arg)
    ### END SOLUTION


def pad(node: UOp, a: np.ndarray) -> np.ndarray:
    ### BEGIN SOLUTION
    return np.pad(a, node.arg)
    ### END SOLUTION


def shrink(node: UOp, a: np.ndarray) -> np.ndarray:
    ### BEGIN SOLUTION
    return a[tuple(slice(start, end) for start, end in node.arg)]
    ### END SOLUTION


def flip(node: UOp, a: np.ndarray) -> np.ndarray:
    ### BEGIN SOLUTION
    return np.flip(a, node.arg)
    ### END SOLUTION


# %% [markdown] id="ex-a3-hint"
# <details><summary>Hints for A3 (click to open)</summary>
#
# - `keepdims=True`: a sum over axis 1 of a (3, 4) array is (3, 1), not (3,).
# - The max of an empty axis is the dtype's lowest value (`-inf` for floats), not an error.
# - PAD fills with zeros, which for a bool mask means `False`: `np.pad` does it.
# </details>

# %% [markdown] id="ex-a-table"
# The table is the backend. Run the grader: every op is checked alone, so one bug never hides another.

# %% id="ex-a-backend"
student_ops = {
    Ops.CONST: const, Ops.NEG: neg, Ops.EXP2: exp2, Ops.LOG2: log2, Ops.SIN: sin, Ops.SQRT: sqrt,
    Ops.RECIPROCAL: reciprocal, Ops.CAST: cast,
    Ops.ADD: add, Ops.MUL: mul, Ops.IDIV: idiv, Ops.FDIV: fdiv, Ops.MOD: mod,
    Ops.MAX: maximum,
    Ops.CMPLT: cmplt, Ops.CMPNE: cmpne,
    Ops.AND: bitwise_and, Ops.OR: bitwise_or, Ops.XOR: bitwise_xor,
    Ops.WHERE: where, Ops.REDUCE_AXIS: reduce_axis,
    Ops.RESHAPE: reshape, Ops.PERMUTE: permute, Ops.EXPAND: expand, Ops.PAD: pad,
    Ops.SHRINK: shrink, Ops.FLIP: flip,
}
StudentInterpreter = InterpreterBackend(student_ops)
StudentInterpreter

# %% id="ex-a-grade" tags=["skip-when-grading"]
grade(StudentInterpreter)

# %% [markdown] id="ex-a-device"
# Your table is now a device like NUMPY or CPU. `register` gives it a name; every Tensor program runs on it,
# through the same scheduler (one kernel per fused group) and an interpreter that calls your functions.

# %% id="ex-a-use" tags=["skip-when-grading"]
StudentInterpreter.register("STUDENT")
a = Tensor([[1.0, 2.0], [3.0, 4.0]], device="STUDENT")
# rounded: numpy's exp may differ in the last digit from one CPU to another
print((a @ a).softmax(1).numpy().round(6))
print(Tensor([1.0, 4.0, 9.0], device="STUDENT").sqrt().numpy())

# %% [markdown] id="ex-a-train"
# The final check trains a digits classifier (an MLP with `nn.Linear` and `nn.optim.Adam`, 300 steps, seeded)
# on your device and on the reference NUMPY device: the accuracies must agree within one percentage point.

# %% id="ex-a-train-run" tags=["skip-when-grading"]
# NBVAL_IGNORE_OUTPUT
# the accuracy it prints can differ in the last digit on another CPU
# (vector math); the next cell checks the verdict
report_a = grade(StudentInterpreter, train=True)
report_a

# %% id="ex-a-train-check" tags=["skip-when-grading"]
report_a.passed

# %% [markdown] id="ex-b-intro"
# ## Exercise B: a code-generating backend
#
# A compiled backend does not compute: it writes source code. The renderer of chapter 8 already walks the kernel
# and writes the loops, the loads and the stores; a language only says how each ALU op looks. Every entry of
# `code_for_op` has the signature every renderer's entries have (chapter 8). This one would write `a - b` (it is
# not one of the ops: ADD and NEG make it):
#
# ```python
# def minus_code(renderer, operands, operand_dtypes, dtype) -> str:
#     a, b = operands
#     return f"({a}-{b})"
# ```
#
# `operands` are the operands as C expressions (strings), `operand_dtypes` their dtypes, and `dtype` the dtype of
# the result — for CAST, the dtype to convert to. It returns a C expression. `renderer` is the CPU device's C
# renderer, for the language's words: `renderer.type_name(dtype)` (`float`, `int`, `signed char`, ...) and
# `renderer.render_const(value, dtype)` (`1.0f`, `INFINITY`, ...). Here they are on a renderer of our own:

# %% id="ex-b-setup"
from pathlib import Path

from tinyteach.device import Buffer, Compiler
from tinyteach.render.c import CRenderer
from tinyteach.runtime.cpu import ClangStyleCompiler, find_c_compiler

c = CRenderer()
print(c.type_name(dtypes.int8), "|", c.render_const(1, dtypes.float32), "|",
      c.render_const(float("-inf"), dtypes.float32))


# %% [markdown] id="ex-b1-intro"
# **B1.** The unary ops and CAST. C's math functions have a float version with an `f` (`exp2f`) and a double
# version without (`exp2`); for `half` (`_Float16`) compute in float and cast back. A C cast does what the
# tests ask only for values the target type can hold: float→int is undefined in C when the value is out of
# range (or NaN), and int→narrower int is implementation-defined (gcc and clang wrap).

# %% id="ex-b1" nbgrader={"grade": false, "grade_id": "ex-b1", "locked": false, "schema_version": 3, "solution": true, "task": false}
def math_call(name: str, a: str, dtype: DType) -> str:
    ### BEGIN SOLUTION
    if dtype == dtypes.float64:
        return f"{name}({a})"
    if dtype == dtypes.float16:
        return f"((_Float16){name}f((float)({a})))"
    return f"{name}f({a})"
    ### END SOLUTION


def neg_code(renderer: CRenderer, operands: list[str], operand_dtypes: list[DType],
             dtype: DType) -> str:
    (a,) = operands
    ### BEGIN SOLUTION
    return f"(!{a})" if dtype == dtypes.bool else f"(-({a}))"
    ### END SOLUTION


def exp2_code(renderer: CRenderer, operands: list[str], operand_dtypes: list[DType],
              dtype: DType) -> str:
    (a,) = operands
    return math_call("exp2", a, dtype)


def log2_code(renderer: CRenderer, operands: list[str], operand_dtypes: list[DType],
              dtype: DType) -> str:
    (a,) = operands
    return math_call("log2", a, dtype)


def sin_code(renderer: CRenderer, operands: list[str], operand_dtypes: list[DType],
             dtype: DType) -> str:
    (a,) = operands
    return math_call("sin", a, dtype)


def sqrt_code(renderer: CRenderer, operands: list[str], operand_dtypes: list[DType],
              dtype: DType) -> str:
    (a,) = operands
    return math_call("sqrt", a, dtype)


def reciprocal_code(renderer: CRenderer, operands: list[str], operand_dtypes: list[DType],
                    dtype: DType) -> str:
    (a,) = operands
    ### BEGIN SOLUTION
    return f"({renderer.render_const(1, dtype)}/{a})"
    ### END SOLUTION


def cast_code(renderer: CRenderer, operands: list[str], operand_dtypes: list[DType],
              dtype: DType) -> str:
    (a,) = operands
    ### BEGIN SOLUTION
    return f"(({renderer.type_name(dtype)})({a}))"
    ### END SOLUTION


# %% [markdown] id="ex-b1-hint"
# <details><summary>Hints for B1 (click to open)</summary>
#
# - Put parentheses around everything you return: your expression is pasted into bigger ones.
# - NEG of a bool is `!a`. `-(a)` with a space-free `-a` would turn `-(-1)` into `--1`, a syntax error.
# - For values in range, C's casts already truncate toward zero; a cast to `bool` turns any nonzero value
#   (NaN too) into `true`. Out-of-range float→int casts are undefined in C: the cases avoid them.
# </details>

# %% [markdown] id="ex-b2-intro"
# **B2.** The binary ops and WHERE. Watch out: in C an integer division by zero is undefined, and on x86 it does not
# return a number, it kills the process (`SIGFPE`) — the grader runs IDIV and MOD in a separate process so it can tell you.

# %% id="ex-b2" nbgrader={"grade": false, "grade_id": "ex-b2", "locked": false, "schema_version": 3, "solution": true, "task": false}
def add_code(renderer: CRenderer, operands: list[str], operand_dtypes: list[DType],
             dtype: DType) -> str:
    a, b = operands
    ### BEGIN SOLUTION
    return f"({a}+{b})"
    ### END SOLUTION


def mul_code(renderer: CRenderer, operands: list[str], operand_dtypes: list[DType],
             dtype: DType) -> str:
    a, b = operands
    ### BEGIN SOLUTION
    return f"({a}*{b})"
    ### END SOLUTION


def idiv_code(renderer: CRenderer, operands: list[str], operand_dtypes: list[DType],
              dtype: DType) -> str:
    a, b = operands
    ### BEGIN SOLUTION
    if dtypes.is_unsigned(dtype):
        return f"({b}==0?0:{a}/{b})"
    return f"({b}==0?0:({b}==-1?-({a}):{a}/{b}))"  # MIN/-1 traps too: -MIN wraps to MIN
    ### END SOLUTION


def fdiv_code(renderer: CRenderer, operands: list[str], operand_dtypes: list[DType],
              dtype: DType) -> str:
    a, b = operands
    ### BEGIN SOLUTION
    return f"({a}/{b})"  # on floats C's / is IEEE's division: x/0 is inf, never a trap
    ### END SOLUTION


def mod_code(renderer: CRenderer, operands: list[str], operand_dtypes: list[DType],
             dtype: DType) -> str:
    a, b = operands
    ### BEGIN SOLUTION
    if dtypes.is_float(dtype):
        return f"fmod({a},{b})"
    if dtypes.is_unsigned(dtype):
        return f"({b}==0?0:{a}%{b})"
    return f"(({b}==0||{b}==-1)?0:{a}%{b})"
    ### END SOLUTION


def max_code(renderer: CRenderer, operands: list[str], operand_dtypes: list[DType],
             dtype: DType) -> str:
    a, b = operands
    ### BEGIN SOLUTION
    if dtypes.is_float(dtype):
        return f"(({a}>{b}||{a}!={a})?{a}:{b})"  # NaN wins, as numpy's maximum
    return f"({a}>{b}?{a}:{b})"
    ### END SOLUTION


def cmplt_code(renderer: CRenderer, operands: list[str], operand_dtypes: list[DType],
               dtype: DType) -> str:
    a, b = operands
    ### BEGIN SOLUTION
    return f"({a}<{b})"
    ### END SOLUTION


def cmpne_code(renderer: CRenderer, operands: list[str], operand_dtypes: list[DType],
               dtype: DType) -> str:
    a, b = operands
    ### BEGIN SOLUTION
    return f"({a}!={b})"
    ### END SOLUTION


def and_code(renderer: CRenderer, operands: list[str], operand_dtypes: list[DType],
             dtype: DType) -> str:
    a, b = operands
    ### BEGIN SOLUTION
    return f"({a}&&{b})" if dtype == dtypes.bool else f"({a}&{b})"
    ### END SOLUTION


def or_code(renderer: CRenderer, operands: list[str], operand_dtypes: list[DType],
            dtype: DType) -> str:
    a, b = operands
    ### BEGIN SOLUTION
    return f"({a}||{b})" if dtype == dtypes.bool else f"({a}|{b})"
    ### END SOLUTION


def xor_code(renderer: CRenderer, operands: list[str], operand_dtypes: list[DType],
             dtype: DType) -> str:
    a, b = operands
    ### BEGIN SOLUTION
    return f"({a}!={b})" if dtype == dtypes.bool else f"({a}^{b})"
    ### END SOLUTION


def where_code(renderer: CRenderer, operands: list[str], operand_dtypes: list[DType],
               dtype: DType) -> str:
    condition, a, b = operands
    ### BEGIN SOLUTION
    return f"({condition}?{a}:{b})"
    ### END SOLUTION


# %% [markdown] id="ex-b2-hint"
# <details><summary>Hints for B2 (click to open)</summary>
#
# - `b==0 ? 0 : a/b` avoids the trap; the other one is `MIN / -1` (the result does not fit): return `-(a)`,
#   which wraps to MIN because the CPU device compiles with `-fwrapv`.
# - `%` is for integers only; floats use `fmod`, which has the same sign rule.
# - MAX: `a>b ? a : b` loses a NaN in `a`; `a!=a` is true only for NaN.
# </details>

# %% [markdown] id="ex-b3-intro"
# **B3.** The glue. The Compiler turns source into a binary — reuse the CPU device's C compiler
# (`C_COMPILER.compile(source)` returns the path of a shared object, cached on disk). The Program loads the
# function called `name` from it with `ctypes` and calls it with each buffer's address
# (`ctypes.c_void_p(buffer.storage.address)`), output buffer first.

# %% id="ex-b3" nbgrader={"grade": false, "grade_id": "ex-b3", "locked": false, "schema_version": 3, "solution": true, "task": false}
C_COMPILER = ClangStyleCompiler(find_c_compiler())


class StudentCompiler(Compiler):
    cache_key = "student-c"

    def compile(self, source: str) -> Path:
        ### BEGIN SOLUTION
        return C_COMPILER.compile(source)
        ### END SOLUTION


class StudentProgram:
    def __init__(self, name: str, library_path: Path):
        ### BEGIN SOLUTION
        self.function = getattr(ctypes.CDLL(str(library_path)), name)
        self.function.restype = None
        ### END SOLUTION

    def __call__(self, *buffers: Buffer) -> None:
        ### BEGIN SOLUTION
        self.function(*(ctypes.c_void_p(buffer.storage.address) for buffer in buffers))
        ### END SOLUTION


# %% id="ex-b-backend"
student_code_for_op = {
    Ops.NEG: neg_code, Ops.EXP2: exp2_code, Ops.LOG2: log2_code, Ops.SIN: sin_code,
    Ops.SQRT: sqrt_code, Ops.RECIPROCAL: reciprocal_code, Ops.CAST: cast_code,
    Ops.ADD: add_code, Ops.MUL: mul_code, Ops.IDIV: idiv_code, Ops.FDIV: fdiv_code,
    Ops.MOD: mod_code, Ops.MAX: max_code,
    Ops.CMPLT: cmplt_code, Ops.CMPNE: cmpne_code, Ops.AND: and_code, Ops.OR: or_code,
    Ops.XOR: xor_code, Ops.WHERE: where_code,
}
StudentCompiled = CodegenBackend(student_code_for_op, StudentCompiler(), StudentProgram)
StudentCompiled

# %% [markdown] id="ex-b-grade-intro"
# The grader compiles one small kernel per case with the CPU device's compiler (so the ops are graded even
# before the glue works), and grades your Compiler and Program on a kernel the reference renderer wrote.

# %% id="ex-b-grade" tags=["skip-when-grading"]
grade(StudentCompiled)

# %% [markdown] id="ex-b-fusion"
# Fusion for free: the scheduler puts `log(exp(2x) + 1)` and its sum into **one** kernel, and your snippets are
# pasted into its loop. Here is the C your backend wrote:

# %% id="ex-b-source" tags=["skip-when-grading"]
from tinyteach.engine.realize import record_launches

StudentCompiled.register("STUDENT_C")
x = Tensor(np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4), device="STUDENT_C")
with record_launches() as launches:
    print(((x * 2).exp() + 1).log().sum(1).numpy())
print(len(launches), "kernel")
print(launches[-1].runner.source)

# %% id="ex-b-train-run" tags=["skip-when-grading"]
# NBVAL_IGNORE_OUTPUT
# the accuracy it prints can differ in the last digit on another CPU
# (-march=native); the next cell checks the verdict
report_b = grade(StudentCompiled, train=True)
report_b

# %% id="ex-b-train-check" tags=["skip-when-grading"]
report_b.passed

# %% [markdown] id="ex-s-intro"
# ## Stretch: an optimization pass, as rewrite rules
#
# A compiler also makes programs cheaper, and chapter 5 showed how: a pass is a table of rules, each a `UPat`
# (which graph to look for, binding names to its nodes) and a function that builds the replacement from the
# bound nodes — or returns `None` to leave the graph as it is. `graph_rewrite` applies the rules bottom-up
# until none matches. The default simplifier, `symbolic`, runs on every kernel; here are its rules:

# %% id="ex-s-setup"
from tinyteach.codegen.lower import linearize, lower_ast
from tinyteach.engine.schedule import create_schedule
from tinyteach.exercises import RULE_NAMES, RewriteRules
from tinyteach.exercises.rewrites import PatternAndBuild
from tinyteach.ir.rewrite import UPat, graph_rewrite, symbolic

print(len(symbolic.rules), "rules in symbolic:", " | ".join(name for name, _, _ in symbolic.rules))

# %% [markdown] id="ex-s-kernel-intro"
# It has `x*1 -> x`, but not `x*2 -> x+x`. Rules run on the kernel IR of chapter 7, where every value is a
# scalar: a `LOAD` of element `gidx0` of a buffer, constants, and ALU ops on them. This kernel computes
# `(t*2) * (t*-1)`; after lowering, the two multiplications by a constant are still there:

# %% id="ex-s-kernel" tags=["skip-when-grading"]
values = np.linspace(-3, 3, 8, dtype=np.float32)
t = Tensor(values, device="CPU").realize()
kernel = create_schedule([((t * 2) * (t * -1)).uop], "CPU")[0][-1]
lowered = lower_ast(kernel.ast)
print(lowered)

# %% [markdown] id="ex-s1-intro"
# **S1.** Write five rules that `symbolic` does not have. Each function returns `(pattern, build)`; the
# `build` function gets the nodes the pattern bound, by name. This is `x*1 -> x` in ir/rewrite.py (its name
# is the key of your table below):
#
# ```python
# x = UPat.var("x")
# UPat(Ops.MUL, src=(x, UPat.const(1))), lambda x: x
# ```
#
# A rule must keep every value: NaN, ±inf and -0.0 included. Two of these do not hold for floats — find out
# why before you write them.

# %% id="ex-s1" nbgrader={"grade": false, "grade_id": "ex-s1", "locked": false, "schema_version": 3, "solution": true, "task": false}
x = UPat.var("x")


def times_two() -> PatternAndBuild:
    """x*2 -> x+x: the same value for every input (doubling is exact, or overflows the same
    way). For integers an addition is cheaper than a multiplication (strength reduction: 1
    cycle against 3 on x86); for float32 both take the same time on current x86 CPUs, and
    the rule only saves the constant 2."""
    ### BEGIN SOLUTION
    return UPat(Ops.MUL, src=(x, UPat.const(2))), lambda x: x + x
    ### END SOLUTION


def times_minus_one() -> PatternAndBuild:
    """x*-1 -> -x: a negation instead of a multiplication."""
    ### BEGIN SOLUTION
    return UPat(Ops.MUL, src=(x, UPat.const(-1))), lambda x: -x
    ### END SOLUTION


def plus_negation() -> PatternAndBuild:
    """x+(-x) -> 0, for integers only."""
    ### BEGIN SOLUTION
    def build(x: UOp) -> UOp | None:
        return UOp.const(x.dtype, 0) if dtypes.is_int(x.dtype) else None  # inf-inf is NaN
    return UPat(Ops.ADD, src=(x, UPat(Ops.NEG, src=(x,)))), build
    ### END SOLUTION


def not_equal_itself() -> PatternAndBuild:
    """x!=x -> False, for anything but floats."""
    ### BEGIN SOLUTION
    def build(x: UOp) -> UOp | None:
        return None if dtypes.is_float(x.dtype) else UOp.const(dtypes.bool, False)  # NaN != NaN
    return UPat(Ops.CMPNE, src=(x, x)), build
    ### END SOLUTION


def where_same() -> PatternAndBuild:
    """where(c, x, x) -> x: both branches are the same node."""
    ### BEGIN SOLUTION
    return UPat(Ops.WHERE, src=(UPat.var("c"), x, x)), lambda c, x: x
    ### END SOLUTION


# %% [markdown] id="ex-s1-hint"
# <details><summary>Hints for S1 (click to open)</summary>
#
# - The matcher tries both orders of a commutative op (ADD, MUL, CMPNE, ...): a pattern for `x*2` matches `2*x` too.
# - A name used twice, `UPat(Ops.CMPNE, src=(x, x))`, matches only when both sources are the same node.
# - For floats, `inf + -inf` is NaN, and `NaN != NaN` is True: test `dtypes.is_int(x.dtype)` or
#   `dtypes.is_float(x.dtype)` in `build`, and return `None` where the rule does not hold.
# - Build `-x` (a NEG), not `0 - x`: `0.0 - 0.0` is `0.0`, while `0.0 * -1` is `-0.0`.
# </details>

# %% [markdown] id="ex-s-table"
# The grader tries each rule alone on small graphs: the result must be exactly the expected graph (or the
# graph itself, where the rule must not fire), and give the same numbers as the original on random inputs —
# NaN, ±inf, -0.0 and the integer limits among them — evaluated with the NUMPY device's ops. Then all five
# run together, as one pass, on graphs where one rewrite makes the next possible.

# %% id="ex-s-rules"
student_rules = {
    "x*2 -> x+x": times_two, "x*-1 -> -x": times_minus_one, "x+(-x) -> 0 (ints)": plus_negation,
    "x!=x -> False (not floats)": not_equal_itself, "where(c, x, x) -> x": where_same,
}
assert list(student_rules) == list(RULE_NAMES)
StudentRules = RewriteRules(student_rules)
StudentRules

# %% id="ex-s-grade" tags=["skip-when-grading"]
grade(StudentRules)

# %% [markdown] id="ex-s-use-intro"
# Your rules as a pass over the real kernel from above: rewrite its lowered graph, linearize and render it
# (chapters 7 and 8), compile it with the CPU device's C compiler and run it on the kernel's buffers. The
# multiplications by 2 and -1 became an addition and a negation, and the numbers are numpy's:

# %% id="ex-s-use" tags=["skip-when-grading"]
from tinyteach.runtime.cpu import CPUProgram

optimized = graph_rewrite(lowered, StudentRules.matcher())
source = CRenderer().render(kernel.name, linearize(optimized))
print(source)
CPUProgram(kernel.name, C_COMPILER.compile(source))(*kernel.buffers)
assert np.array_equal(kernel.output.numpy(), (values * 2) * (values * -1))

# %% [markdown] id="ex-instructors"
# ## For instructors: the student version
#
# This notebook holds the solutions between nbgrader's solution markers (a comment line before and after
# each solution), in cells with nbgrader metadata. Generate the student version with nbgrader:
#
# ```sh
# pip install nbgrader
# mkdir -p source/backend && cp chapters/12_exercise_backend.ipynb source/backend/
# nbgrader generate_assignment backend --force   # writes release/backend/12_exercise_backend.ipynb
# ```
#
# or without nbgrader, with the same markers: `python -m tinyteach.exercises.student_version
# chapters/12_exercise_backend.ipynb release/`. Each solution becomes `raise NotImplementedError()` and every
# output is cleared; the grader then reports those ops and rules as "not implemented". The repository ships
# that student version as `exercises/12_exercise_backend_student.ipynb`; after changing a solution, `make
# student-copy` regenerates it (a test fails until you do). Cells tagged `skip-when-grading`
# (the ones that call `grade` or use the device) are skipped by the terminal grader,
# `python -m tinyteach.exercises <notebook>`.
