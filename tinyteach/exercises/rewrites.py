"""Chapter 12 (stretch exercise): rewrite rules — an optimization pass, in chapter 5's matcher.

What this teaches:
- an optimization is a table of rules (ir/rewrite.py): a `UPat` that says which graph to look
  for, and a function that builds the cheaper graph from the nodes the pattern bound. The
  default simplifier (`rewrite.symbolic`) has x*1 -> x and x+0 -> x; the student writes five
  rules it does not have, such as the strength reduction x*2 -> x+x;
- a rule must keep every value. x+(-x) is 0 for integers, but for floats inf-inf is NaN; x!=x
  is False for integers, but NaN != NaN is True. A rule that forgets this changes a program's
  numbers, and the grader shows the input where it does;
- the rules work on the kernel IR of chapter 7, where every value is a scalar: a LOAD of element
  `gidx0` of a buffer, constants, and ALU ops on them.

Each rule is graded alone, on small graphs: graph_rewrite with that one rule must give exactly
the expected graph (or leave the graph as it is, where the rule must not fire), and both graphs
must give the same numbers — NaN, inf and -0.0 included — on random inputs, evaluated with the
reference ops of the NUMPY device (runtime/numpy.py). When every rule passes, all of them run
together, as one pass, on graphs where one rewrite makes the next possible.

Builds on: ir/rewrite.py, ir/uop.py, runtime/numpy.py, exercises/report.py. Used by: autograder.py,
reference.py and chapters/12_exercise_backend.ipynb.

>>> from tinyteach.exercises.reference import reference_rules
>>> rows = grade_rules(reference_rules())
>>> [row.status for row in rows] == ["pass"] * (len(RULE_NAMES) + 1)
True
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tinyteach.dtype import DType, dtypes
from tinyteach.exercises.report import FAIL, NOT_IMPLEMENTED, PASS, SKIPPED, Failure, Row, show
from tinyteach.ir.rewrite import PatternMatcher, UPat, graph_rewrite
from tinyteach.ir.uop import Ops, UOp
from tinyteach.runtime.numpy import NUMPY_OPS

# what a student's rule function returns: the pattern, and the function that builds the result
# from the nodes the pattern bound (or returns None: no rewrite)
PatternAndBuild = tuple[UPat, Callable[..., UOp | None]]
RuleFunction = Callable[[], PatternAndBuild]

SIZE = 16  # elements of every input buffer: each graph is evaluated for all of them at once
MAX_STEPS = 1_000  # a rule whose results keep matching (x*2 -> (x*2)*1 ...) stops here


# ---- the graphs: scalars a kernel loads, as in every lowered kernel (chapter 7) ----

LOOP = UOp(Ops.RANGE, dtypes.int32, (), ("g", 0, SIZE))


def kernel_input(number: int, dtype: DType) -> UOp:
    """Element gidx0 of the buffer `number`: LOAD(DEFINE_GLOBAL, RANGE)."""
    buffer = UOp(Ops.DEFINE_GLOBAL, dtype, (), (number, SIZE))
    return UOp(Ops.LOAD, dtype, (buffer, LOOP))


f32, i32, boolean = dtypes.float32, dtypes.int32, dtypes.bool
a, b = kernel_input(1, f32), kernel_input(2, f32)
i, j = kernel_input(3, i32), kernel_input(4, i32)
c = kernel_input(5, boolean)
INPUT_NAMES = {a: "a", b: "b", i: "i", j: "j", c: "c"}  # a, b: float32; i, j: int32; c: bool


def mul(x: UOp, value: float | int) -> UOp:
    """x * value, with the constant a scalar (as lowering makes it)."""
    return UOp(Ops.MUL, x.dtype, (x, UOp.const(x.dtype, value)))


def zero(dtype: DType) -> UOp:
    return UOp.const(dtype, 0)


@dataclass(frozen=True)
class RuleCase:
    """One graph a rule is tried on; `expected` is what it must become (None: stay as it is)."""

    label: str
    graph: UOp
    expected: UOp | None = None

    @property
    def target(self) -> UOp:
        return self.graph if self.expected is None else self.expected


FALSE = UOp.const(boolean, False)

RULE_CASES: dict[str, list[RuleCase]] = {
    "x*2 -> x+x": [
        RuleCase("float32", mul(a, 2.0), a + a),
        RuleCase("int32, written 2*x", UOp(Ops.MUL, i32, (UOp.const(i32, 2), i)), i + i),
        RuleCase("x*3 stays as it is", mul(a, 3.0)),
    ],
    "x*-1 -> -x": [
        RuleCase("float32 (0.0*-1 is -0.0)", mul(a, -1.0), -a),
        RuleCase("int32 (MIN*-1 wraps to MIN)", mul(i, -1), -i),
        RuleCase("x*-2 stays as it is", mul(a, -2.0)),
    ],
    "x+(-x) -> 0 (ints)": [
        RuleCase("int32", i + (-i), zero(i32)),
        RuleCase("int32, written -x+x", (-i) + i, zero(i32)),
        RuleCase("float32 stays as it is (inf-inf is NaN)", a + (-a)),
        RuleCase("x+(-y) stays as it is", i + (-j)),
    ],
    "x!=x -> False (not floats)": [
        RuleCase("int32", i.ne(i), FALSE),
        RuleCase("bool", c.ne(c), FALSE),
        RuleCase("float32 stays as it is (NaN != NaN)", a.ne(a)),
        RuleCase("x!=y stays as it is", i.ne(j)),
    ],
    "where(c, x, x) -> x": [
        RuleCase("float32", c.where(a, a), a),
        RuleCase("int32", c.where(i, i), i),
        RuleCase("where(c, x, y) stays as it is", c.where(a, b)),
    ],
}
RULE_NAMES: tuple[str, ...] = tuple(RULE_CASES)

TOGETHER = "all rules together, in one pass"
TOGETHER_CASES = [
    RuleCase("where(c, a*2, a*2) -> a+a", c.where(mul(a, 2.0), mul(a, 2.0)), a + a),
    RuleCase("i*-1 + i -> 0", mul(i, -1) + i, zero(i32)),
    RuleCase("i*2 != i*2 -> False", mul(i, 2).ne(mul(i, 2)), FALSE),
]

RULE_HINTS: dict[str, str] = {
    "x*2 -> x+x": "UPat(Ops.MUL, src=(UPat.var('x'), UPat.const(2))), and build x + x. The "
                  "matcher tries both orders of a commutative op, so 2*x matches too; match the "
                  "constant 2 only, not any constant.",
    "x*-1 -> -x": "UPat.const(-1) as the second source; build -x (a NEG node), not 0-x: 0.0-0.0 "
                  "is 0.0, while 0.0*-1 is -0.0.",
    "x+(-x) -> 0 (ints)": "use the name 'x' twice: UPat(Ops.ADD, src=(x, UPat(Ops.NEG, "
                          "src=(x,)))) matches only when both are the same node. Return "
                          "UOp.const(x.dtype, 0) for ints only (dtypes.is_int(x.dtype)) and None "
                          "for floats: inf + -inf and NaN + -NaN are NaN.",
    "x!=x -> False (not floats)": "UPat(Ops.CMPNE, src=(x, x)); the result is a bool: "
                                  "UOp.const(dtypes.bool, False). Return None for floats: NaN != "
                                  "NaN is True.",
    "where(c, x, x) -> x": "WHERE has three sources (condition, a, b): UPat(Ops.WHERE, "
                           "src=(UPat.var('c'), x, x)); the build function gets c and x.",
}


# ---- the student's table ----

class RewriteRules:
    """A student's rules: {"x*2 -> x+x": function returning (UPat, build), ...}."""

    kind = "rewrite"

    def __init__(self, rules: dict[str, RuleFunction]):
        unknown = [name for name in rules if name not in RULE_NAMES]
        if unknown:
            raise ValueError(f"unknown rule name(s) {unknown}: the rules are {list(RULE_NAMES)}")
        self.rules = dict(rules)

    def __repr__(self) -> str:
        return f"<RewriteRules: {len(self.rules)} of {len(RULE_NAMES)} rules in the table>"

    def missing(self) -> list[str]:
        """The rules the table does not have yet."""
        return [name for name in RULE_NAMES if name not in self.rules]

    def matcher(self) -> PatternMatcher:
        """Every rule of the table as one pass (a stubbed rule raises NotImplementedError)."""
        rules = []
        for name in RULE_NAMES:
            if name in self.rules:
                pattern, build = checked_rule(name, self.rules[name]())
                rules.append((name, pattern, build))
        return PatternMatcher("student rules", rules)


def checked_rule(name: str, returned: object) -> PatternAndBuild:
    """What a rule function returned, if it is (UPat, function); a clear error otherwise."""
    if (isinstance(returned, tuple) and len(returned) == 2 and isinstance(returned[0], UPat)
            and callable(returned[1])):
        return returned[0], returned[1]
    raise TypeError(f"the rule {name!r} must return (UPat, build function), not {returned!r}")


# ---- evaluating a graph with the reference ops ----

def input_values(dtype: DType, seed: int) -> np.ndarray:
    """SIZE random values of `dtype`, the edge cases included (NaN, ±inf, -0.0, MIN, MAX)."""
    rng = np.random.default_rng(seed)
    if dtypes.is_float(dtype):
        special = [0.0, -0.0, np.inf, -np.inf, np.nan, 3e38]
        values = np.concatenate([special, rng.normal(0, 10, SIZE - len(special))])
    elif dtype == boolean:
        values = np.arange(SIZE) % 2 == rng.integers(0, 2, SIZE)
    else:
        info = np.iinfo(dtype.np)
        special = [0, -1, 1, info.min, info.max, 2**30]
        values = np.concatenate([special, rng.integers(-1000, 1000, SIZE - len(special))])
    return np.asarray(values).astype(dtype.np)


def inputs_of(graph: UOp) -> dict[UOp, np.ndarray]:
    """Values for every LOAD of the graph (the same for a buffer wherever it appears)."""
    loads = [node for node in graph.toposort if node.op is Ops.LOAD]
    return {load: input_values(load.dtype, load.src[0].arg[0]) for load in loads}


def evaluate(graph: UOp, inputs: dict[UOp, np.ndarray]) -> np.ndarray:
    """The graph's value for every element, each op computed by the NUMPY device's function."""
    values: dict[UOp, np.ndarray] = {}
    with np.errstate(all="ignore"):  # inf, NaN and wrap-around are values, not errors
        for node in graph.toposort:
            if node in inputs:
                values[node] = inputs[node]
            elif node.op in (Ops.DEFINE_GLOBAL, Ops.RANGE):
                continue  # the parts of a LOAD: its value is given
            elif node.op not in NUMPY_OPS or node.op is Ops.LOAD:
                raise ValueError(f"{node.op.name} is not an op a rule may build here")
            else:
                values[node] = NUMPY_OPS[node.op](node, *(values[s] for s in node.src))
    result = np.asarray(values[graph], dtype=graph.dtype.np)
    return np.broadcast_to(result, (SIZE,))


def differences(expected: np.ndarray, received: np.ndarray) -> np.ndarray:
    """Where two results differ; floats must agree bit for bit in meaning: NaN is NaN, -0.0
    is not 0.0."""
    if expected.dtype.kind != "f":
        return expected != received
    both_nan = np.isnan(expected) & np.isnan(received)
    same = (expected == received) & (np.signbit(expected) == np.signbit(received))
    return ~(both_nan | same)


# ---- showing a small graph in one line ----

SYMBOLS = {Ops.ADD: "+", Ops.MUL: "*", Ops.FDIV: "/", Ops.IDIV: "//", Ops.MOD: "%",
           Ops.CMPLT: "<", Ops.CMPNE: "!=", Ops.AND: "&", Ops.OR: "|", Ops.XOR: "^"}


def infix(graph: UOp) -> str:
    """a*2.0 -> '(a*2.0)': the inputs by name, constants by value (no recursion: built from the
    sources up)."""
    text: dict[UOp, str] = {}
    for node in graph.toposort:
        sources = [text.get(s, "?") for s in node.src]
        if node in INPUT_NAMES:
            text[node] = INPUT_NAMES[node]
        elif node.op is Ops.CONST:
            text[node] = repr(node.arg)
        elif node.op is Ops.NEG:
            text[node] = f"(-{sources[0]})"
        elif node.op in SYMBOLS:
            text[node] = f"({sources[0]}{SYMBOLS[node.op]}{sources[1]})"
        else:
            text[node] = f"{node.op.name.lower()}({', '.join(sources)})"
    return text[graph]


# ---- grading ----

class RuleNotImplemented(Exception):
    """The rule is missing from the table, or raises NotImplementedError."""


class BrokenRule(Exception):
    """The rule function raised an error, or returned something else than (UPat, build)."""


def student_matcher(rules: RewriteRules, names: tuple[str, ...]) -> PatternMatcher:
    built = []
    for name in names:
        function = rules.rules.get(name)
        if function is None:
            raise RuleNotImplemented(f"no rule {name!r} in the table")
        try:
            pattern, build = checked_rule(name, function())
        except NotImplementedError as error:
            raise RuleNotImplemented(str(error) or "raises NotImplementedError") from None
        except Exception as error:  # the student's function crashed: shown in the report
            raise BrokenRule(f"{type(error).__name__}: {error}") from None
        built.append((name, pattern, build))
    return PatternMatcher("student", built)


def check_case(name: str, case: RuleCase, matcher: PatternMatcher) -> Row | None:
    """None when the case passes, else the failing row."""
    try:
        result = graph_rewrite(case.graph, matcher, max_steps=MAX_STEPS)
    except NotImplementedError as error:
        raise RuleNotImplemented(str(error) or "raises NotImplementedError") from None
    except Exception as error:  # the student's rule crashed: that is a failure to show
        return failed(name, case, f"graph: {infix(case.graph)}", "a rewritten graph",
                      f"raised {type(error).__name__}: {error}")
    inputs = inputs_of(case.graph)
    expected = evaluate(case.graph, inputs)
    try:
        received = evaluate(result, inputs)
    except (ValueError, KeyError) as error:
        return failed(name, case, f"graph: {infix(case.graph)} -> {infix(result)}",
                      "a graph of the reference ops", f"cannot be evaluated: {error}")
    if expected.dtype != received.dtype or differences(expected, received).any():
        return value_changed(name, case, result, inputs, expected, received)
    if result is not case.target:
        unchanged = " (unchanged)" if case.expected is None else ""
        return failed(name, case, f"graph: {infix(case.graph)}", infix(case.target) + unchanged,
                      infix(result), "not the expected graph")
    return None


def value_changed(name: str, case: RuleCase, result: UOp, inputs: dict[UOp, np.ndarray],
                  expected: np.ndarray, received: np.ndarray) -> Row:
    """The row for a rewrite that changes the numbers: the first element where they differ."""
    described = f"{infix(case.graph)} rewritten to {infix(result)}"
    if expected.dtype != received.dtype:
        return failed(name, case, described, show(expected), show(received), "changes the dtype")
    k = int(np.argmax(differences(expected, received)))
    values = ", ".join(f"{INPUT_NAMES.get(node, '?')} = {show(element(array, k))}"
                       for node, array in inputs.items())
    return failed(name, case, f"{described}, at {values}", show(element(expected, k)),
                  show(element(received, k)), "changes the value")


def element(values: np.ndarray, k: int) -> np.ndarray:
    """Element k, as a 0-d array (show() prints it with its dtype)."""
    return np.asarray(values[k:k + 1].reshape(()))


def failed(name: str, case: RuleCase, inputs: str, expected: str, received: str,
           note: str = "") -> Row:
    hint = RULE_HINTS.get(name, "every rule passed alone: look at how they combine")
    return Row(name, FAIL, note or case.label, Failure(case.label, inputs, expected, received),
               hint)


def grade_rule(rules: RewriteRules, name: str, cases: list[RuleCase],
               names: tuple[str, ...]) -> Row:
    """Run every case with the rules `names` as one pass; the row reports the first failure."""
    try:
        matcher = student_matcher(rules, names)
        for case in cases:
            row = check_case(name, case, matcher)
            if row is not None:
                return row
    except RuleNotImplemented as error:
        return Row(name, NOT_IMPLEMENTED, str(error))
    except BrokenRule as error:
        failure = Failure("call the rule function", "", "(UPat, build function)", str(error))
        return Row(name, FAIL, "not a rule", failure, RULE_HINTS.get(name, ""))
    return Row(name, PASS, f"{len(cases)} graphs")


def grade_rules(rules: RewriteRules) -> list[Row]:
    """One row per rule, each graded alone; then all of them together, once each passes."""
    rows = [grade_rule(rules, name, RULE_CASES[name], (name,)) for name in RULE_NAMES]
    if all(row.status == PASS for row in rows):
        rows.append(grade_rule(rules, TOGETHER, TOGETHER_CASES, RULE_NAMES))
    else:
        rows.append(Row(TOGETHER, SKIPPED, "runs once every row above passes"))
    return rows
