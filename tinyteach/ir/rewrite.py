"""Chapter 5: rewriting graphs — patterns, rules and a rewrite engine.

What this teaches:
- a compiler pass is a table of rules: "when you see this shape of graph, build that instead".
  `UPat` describes a shape (op, sources, arg, a name to bind), `PatternMatcher` holds the rules,
  and `graph_rewrite` applies them bottom-up until nothing changes;
- constant folding and algebraic simplification (`x*1 -> x`, `(i*8 + j) // 8 -> i`) are just
  rules, and the index arithmetic that views produce (chapter 4) becomes tidy with them;
- every rewrite can be recorded (`record_rewrites()`, or DEBUG=5) so you can step through what a
  pass did, rule by rule.

Builds on: ir/uop.py (the nodes), ir/view.py (what produces index arithmetic).
Used by: codegen/lower.py, which runs `symbolic` over every kernel's index math.

>>> from tinyteach.dtype import dtypes
>>> i = UOp(Ops.RANGE, dtypes.int32, (), ("g", 0, 4))
>>> graph_rewrite((i * 8 + 3) // 8, symbolic) is i
True
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tinyteach.dtype import (
    DType,
    dtypes,
    float_to_int,
    from_bfloat16_bits,
    to_bfloat16_bits,
    truncate_to,
)
from tinyteach.ir.uop import ALU, Ops, UOp, float_divide, is_bitcast
from tinyteach.settings import DEBUG

COMMUTATIVE = (Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR)
_ANY = object()


@dataclass(frozen=True)
class UPat:
    """A pattern: which op(s), which sources, which arg; `name` binds the matched node."""

    op: Ops | tuple[Ops, ...] | None = None
    src: tuple[UPat, ...] | None = None
    arg: Any = _ANY
    name: str | None = None
    dtype: DType | None = None
    # computed once from the fields above (`match` runs for every node and every rule):
    # the ops as a set (None: any op), and the ops that some source must have (see early_reject)
    ops: frozenset[Ops] | None = field(init=False, repr=False, compare=False)
    source_ops: frozenset[Ops] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ops = None if self.op is None else frozenset(_as_tuple(self.op))
        single = [p.op for p in self.src or () if isinstance(p.op, Ops)]
        object.__setattr__(self, "ops", ops)  # (a frozen dataclass is set this way)
        object.__setattr__(self, "source_ops", frozenset(single))

    @staticmethod
    def var(name: str, dtype: DType | None = None) -> UPat:
        """Any node, bound to `name`."""
        return UPat(name=name, dtype=dtype)

    @staticmethod
    def cvar(name: str) -> UPat:
        """A constant, bound to `name`."""
        return UPat(Ops.CONST, name=name)

    @staticmethod
    def const(value: Any) -> UPat:
        """A constant with exactly this value."""
        return UPat(Ops.CONST, arg=value)

    def match(self, node: UOp, bindings: dict[str, UOp]) -> bool:
        """Does `node` have this shape? If so, `bindings` gains the named parts; if not, it is
        left as it was (a source order that failed takes back what it bound)."""
        if self.ops is not None and node.op not in self.ops:
            return False
        if self.dtype is not None and node.dtype != self.dtype:
            return False
        if self.arg is not _ANY and not _same_arg(node.arg, self.arg):
            return False
        bound = len(bindings)
        if self.name is not None:
            earlier = bindings.get(self.name)
            if earlier is not None and earlier is not node:
                return False
            bindings[self.name] = node
        if self.src is None or self._match_sources(node, bindings):
            return True
        _forget_since(bindings, bound)
        return False

    def _match_sources(self, node: UOp, bindings: dict[str, UOp]) -> bool:
        assert self.src is not None
        if len(self.src) != len(node.src):
            return False
        bound = len(bindings)
        if _match_all(self.src, node.src, bindings):
            return True
        if node.op not in COMMUTATIVE or len(node.src) != 2:
            return False
        _forget_since(bindings, bound)
        return _match_all(self.src, node.src[::-1], bindings)  # a+b matches b+a's pattern


def _match_all(patterns: tuple[UPat, ...], nodes: tuple[UOp, ...],
               bindings: dict[str, UOp]) -> bool:
    for pattern, node in zip(patterns, nodes):
        if not pattern.match(node, bindings):
            return False
    return True


def _forget_since(bindings: dict[str, UOp], count: int) -> None:
    """Undo a failed try: drop the names bound after the first `count` (a dict keeps the order
    names were added in, and popitem takes the last one)."""
    while len(bindings) > count:
        bindings.popitem()


def _as_tuple(op: Ops | tuple[Ops, ...]) -> tuple[Ops, ...]:
    return op if isinstance(op, tuple) else (op,)


def _same_arg(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b if isinstance(b, bool) else a == b


Rule = tuple[str, UPat, Callable[..., UOp | None]]


class PatternMatcher:
    """An ordered table of named rules; `rewrite` returns the first rule's result, or None.

    Two cheap tests skip most rules before any matching (tinygrad's PatternMatcher does the
    same): the table is indexed by the root op, so a node only meets the rules written for its
    op (or for any op), and a rule whose pattern names a source op the node's sources lack,
    as `x+0` needs a CONST, is rejected early. Neither changes which rule fires first."""

    def __init__(self, name: str, rules: list[Rule]):
        self.name, self.rules = name, rules
        # the rules that can match each op, in table order (a rule for "any op" goes everywhere)
        self.rules_for: dict[Ops, list[Rule]] = {
            op: [rule for rule in rules if rule[1].ops is None or op in rule[1].ops]
            for op in Ops}

    def rewrite(self, node: UOp) -> tuple[str, UOp] | None:
        source_ops = {source.op for source in node.src}
        for rule_name, pattern, build in self.rules_for[node.op]:
            if not pattern.source_ops <= source_ops:
                continue  # early reject: a source the pattern names is missing
            bindings: dict[str, UOp] = {}
            if pattern.match(node, bindings):
                result = build(**bindings)
                if result is not None and result is not node:
                    return rule_name, result
        return None

    def __add__(self, other: PatternMatcher) -> PatternMatcher:
        return PatternMatcher(f"{self.name}+{other.name}", self.rules + other.rules)


# ---- recording: what every rewrite did, for DEBUG=5 and viz ----

@dataclass
class RewriteStep:
    pass_name: str
    rule: str
    before: UOp
    after: UOp


@dataclass
class RewriteLog:
    steps: list[RewriteStep] = field(default_factory=list)


_active_logs: list[RewriteLog] = []


@contextlib.contextmanager
def record_rewrites() -> Iterator[RewriteLog]:
    """Record every rule applied inside the block: `with record_rewrites() as log: ...`."""
    log = RewriteLog()
    _active_logs.append(log)
    try:
        yield log
    finally:
        _active_logs.remove(log)


def recording() -> bool:
    """Is every rewrite being watched (a `record_rewrites()` block, or DEBUG=5)? Then no pass
    may skip one by remembering an earlier result."""
    return bool(_active_logs) or DEBUG.value >= 5


def _note(pass_name: str, rule: str, before: UOp, after: UOp) -> None:
    for log in _active_logs:
        log.steps.append(RewriteStep(pass_name, rule, before, after))
    if DEBUG >= 5:
        print(f"  rewrite [{pass_name}] {rule}: {before.op.name} -> {after.op.name}")


# ---- the engine ----

def graph_rewrite(root: UOp, matcher: PatternMatcher, max_steps: int = 1_000_000,
                  memo: dict[UOp, UOp] | None = None) -> UOp:
    """Rewrite bottom-up: rebuild each node from rewritten sources, then apply rules to it
    until none matches. Returns the new root (the old graph is untouched: UOps are immutable).

    `memo` carries what earlier passes with the same matcher found: UOps are immutable and
    rules are pure functions of a node, so a node rewritten once is rewritten the same way
    again (kernels share much of their index arithmetic). It is skipped while rewrites are
    being recorded, which must see every step."""
    if memo is not None and not recording():
        if len(memo) > MAX_MEMO:
            memo.clear()
        return _Rewriter(matcher, max_steps, memo).rewrite(root)
    return _Rewriter(matcher, max_steps).rewrite(root)


MAX_MEMO = 50_000  # nodes a shared memo keeps (and keeps alive) before starting over


@dataclass
class _Rewriter:
    """One pass. `done` maps every node seen to its rewritten form; a finished node maps to
    itself, so nodes a rule builds out of finished parts are not rewritten again."""

    matcher: PatternMatcher
    max_steps: int
    done: dict[UOp, UOp] = field(default_factory=dict)
    steps: int = 0

    def rewrite(self, root: UOp) -> UOp:
        # an explicit stack, not recursion: graphs are as deep as the user's chain of ops, and
        # a rule's result may need rewriting in turn (a distributed 10,000-term sum nests
        # 10,000 deep). Each entry is (node, what to do next): VISIT pushes its sources,
        # REBUILD rebuilds it from rewritten sources and applies the rules, and FINISH takes
        # over what a rule's (now rewritten) result became, and tries the rules on that again.
        stack: list[tuple[UOp, int, UOp | None]] = [(root, _VISIT, None)]
        done = self.done
        while stack:
            node, stage, result = stack.pop()
            if stage == _VISIT:
                if node not in done:
                    stack.append((node, _REBUILD, None))
                    stack.extend([(s, _VISIT, None) for s in reversed(node.src) if s not in done])
            elif stage == _REBUILD:
                if node not in done:
                    new_sources = tuple([done[s] for s in node.src])
                    current = node if new_sources == node.src else node.replace(src=new_sources)
                    self._apply_rules(node, current, stack)
            else:
                assert result is not None
                self._apply_rules(node, done[result], stack)
        return done[root]

    def _apply_rules(self, node: UOp, current: UOp,
                     stack: list[tuple[UOp, int, UOp | None]]) -> None:
        """`node` is `current` unless a rule matches it; then the rule's result is rewritten
        first (its new nodes may match rules too), and `node` becomes what that becomes."""
        found = self.matcher.rewrite(current)
        if found is None:
            self.done[node] = current
            self.done[current] = current
            return
        rule_name, result = found
        _note(self.matcher.name, rule_name, current, result)
        # count here: a rule that never finishes must stop with this error, not run forever
        self.steps += 1
        if self.steps > self.max_steps:
            raise RuntimeError(f"rewrite pass {self.matcher.name} did not finish")
        stack.append((node, _FINISH, result))
        stack.append((result, _VISIT, None))


_VISIT, _REBUILD, _FINISH = 0, 1, 2  # the stages of a node in _Rewriter.rewrite


# ---- constant folding: the reference meaning of each ALU op on Python scalars ----

def _c_idiv(a: int, b: int) -> int:
    if b == 0:
        return 0  # as our backends do: integer division by zero gives 0, never a crash
    quotient = abs(a) // abs(b)
    return quotient if (a < 0) == (b < 0) else -quotient


def _c_mod(a: int, b: int) -> int:
    return 0 if b == 0 else a - b * _c_idiv(a, b)


def _max(a: Any, b: Any) -> Any:
    """MAX as the devices compute it: a if a > b or a is NaN, else b (Python's max(1.0, nan)
    is 1.0, so folding with it would drop a NaN that every device keeps)."""
    return a if a > b or a != a else b


def _safe_log2(a: float) -> float:
    if a < 0 or math.isnan(a):
        return math.nan
    return -math.inf if a == 0 else math.log2(a)


PYTHON_ALU: dict[Ops, Callable[..., Any]] = {
    Ops.NEG: lambda a: -a, Ops.EXP2: lambda a: 2.0 ** a if a < 1024 else math.inf,
    Ops.LOG2: _safe_log2, Ops.SIN: math.sin,
    Ops.SQRT: lambda a: math.sqrt(a) if a >= 0 else math.nan,
    Ops.RECIPROCAL: lambda a: 1 / a if a != 0 else math.copysign(math.inf, a),
    Ops.ADD: lambda a, b: a + b, Ops.MUL: lambda a, b: a * b,
    Ops.IDIV: _c_idiv, Ops.FDIV: float_divide, Ops.MOD: _c_mod, Ops.MAX: _max,
    Ops.CMPLT: lambda a, b: a < b, Ops.CMPNE: lambda a, b: a != b,
    Ops.AND: lambda a, b: a & b, Ops.OR: lambda a, b: a | b, Ops.XOR: lambda a, b: a ^ b,
    Ops.WHERE: lambda c, a, b: a if c else b,
}


def fold_constants(node: UOp) -> UOp | None:
    """An ALU op whose sources are all constants becomes a constant."""
    if is_bitcast(node):
        return fold_bitcast(node)
    if node.op is Ops.CAST:
        return fold_cast(node)
    if dtypes.is_float(node.dtype) and node.op in (Ops.EXP2, Ops.SIN, Ops.LOG2):
        return None  # leave transcendental functions to the device, for bit-exact results
    try:
        value = PYTHON_ALU[node.op](*(s.arg for s in node.src))
    except (OverflowError, ValueError):
        return None
    return UOp.const(node.dtype, truncate_to(node.dtype, value))


def fold_cast(node: UOp) -> UOp:
    """A conversion of a constant, as the devices convert it: a float to an integer type
    toward zero, saturated, NaN -> 0 (dtype.float_to_int, which the NUMPY device uses too);
    else the constant stored as the new dtype (integers wrap, floats round)."""
    source = node.src[0]
    if dtypes.is_float(source.dtype) and dtypes.is_int(node.dtype):
        value = float_to_int(np.array(source.arg, dtype=np.float64), node.dtype.scalar.np)
        return UOp.const(node.dtype, value.item())
    return UOp.const(node.dtype, source.arg)


def fold_bitcast(node: UOp) -> UOp | None:
    """A bitcast of a constant: its bits, read as the new dtype by numpy's `view` (never a
    conversion of the value). Not where either side is a NaN: a constant holds a Python float,
    which keeps no NaN payload, so such a bitcast is left to the device, which keeps the bits."""
    source = node.src[0]
    if node.dtype.count > 1 or _is_nan(source.arg):
        return None
    if source.dtype == dtypes.bfloat16:  # (its host format is the word: dtype.py)
        bits = to_bfloat16_bits(np.asarray(source.arg, dtype=np.float32))
    else:
        bits = np.asarray(source.arg, dtype=source.dtype.np)  # exact: the value is of its dtype
    value = bits.view(node.dtype.np)
    if node.dtype == dtypes.bfloat16:
        value = from_bfloat16_bits(value)
    if _is_nan(value.item()):
        return None
    return UOp.const(node.dtype, value.item())


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


# ---- symbolic: simplification of index arithmetic and algebra ----

def sum_terms(node: UOp) -> list[UOp]:
    """The terms of a sum, left to right: (a + b) + c -> [a, b, c]."""
    terms: list[UOp] = []
    stack = [node]  # (a sum of 10,000 terms is a chain 10,000 deep: no recursion)
    while stack:
        current = stack.pop()
        if current.op is Ops.ADD:
            stack.extend(reversed(current.src))
        else:
            terms.append(current)
    return terms


def _factor(term: UOp) -> int:
    """The constant factor of a term: i*8 -> 8, 5 -> 5, i -> 1."""
    if term.op is Ops.CONST:
        return int(term.arg)
    if term.op is Ops.MUL and term.src[1].op is Ops.CONST:
        return int(term.src[1].arg)
    return 1


def _divide_term(term: UOp, divisor: int) -> UOp:
    if term.op is Ops.CONST:
        return UOp.const(term.dtype, term.arg // divisor)
    return term.src[0] * (term.src[1].arg // divisor)


def _sum(terms: list[UOp], dtype: DType) -> UOp:
    if not terms:
        return UOp.const(dtype, 0)
    total = terms[0]
    for term in terms[1:]:
        total = total + term
    return total


def _split_by_divisor(x: UOp, divisor: int) -> tuple[list[UOp], list[UOp]] | None:
    """Split the terms of x into multiples of `divisor` and the rest (non-negative terms only)."""
    if divisor <= 0 or x.dtype.kind not in ("int", "uint") or x.vmin < 0:
        return None
    terms = sum_terms(x)
    if any(t.vmin < 0 for t in terms):
        return None
    multiples = [t for t in terms if _factor(t) % divisor == 0]
    return multiples, [t for t in terms if _factor(t) % divisor != 0]


def simplify_idiv(x: UOp, c: UOp) -> UOp | None:
    """(a*c + b) // c -> a + b // c, and b // c -> 0 when 0 <= b < c."""
    split = _split_by_divisor(x, c.arg)
    if split is None:
        return None
    multiples, rest = split
    remainder = _sum(rest, x.dtype)
    if not multiples:
        if remainder.vmax < c.arg:
            return UOp.const(x.dtype, 0)
        common = _split_by_common_factor(x, c.arg)
        if common is None:
            return None
        factor, scaled, small = common  # x = factor*q + small, 0 <= small < factor
        return _sum([_divide_term(t, factor) for t in scaled], x.dtype) // (c.arg // factor)
    quotient = _sum([_divide_term(t, c.arg) for t in multiples], x.dtype)
    return quotient if remainder.vmax < c.arg else quotient + remainder // c


def simplify_mod(x: UOp, c: UOp) -> UOp | None:
    """(a*c + b) % c -> b % c, and b % c -> b when 0 <= b < c.
    A term's factor also counts modulo c: (r*(c+2) + b) % c -> (r*2 + b) % c."""
    split = _split_by_divisor(x, c.arg)
    if split is None:  # a negative term (or not an int): its sum may still be >= 0
        if not _is_int(x) or c.arg <= 0 or x.vmin < 0:
            return None
        return x if x.vmax < c.arg else _congruent_in_range(x, c.arg)
    multiples, rest = split
    reduced = [_reduce_factor(t, c.arg) for t in rest]
    remainder = _sum(reduced, x.dtype)
    if remainder.vmax < c.arg:
        return remainder
    changed = multiples or any(r is not t for r, t in zip(reduced, rest))
    if changed:
        return remainder % c
    common = _split_by_common_factor(x, c.arg)
    if common is None:
        return None
    factor, scaled, small = common  # x = factor*q + small, 0 <= small < factor
    quotient = _sum([_divide_term(t, factor) for t in scaled], x.dtype)
    return (quotient % (c.arg // factor)) * factor + _sum(small, x.dtype)


def _congruent_in_range(x: UOp, divisor: int) -> UOp | None:
    """For x >= 0: a sum y with y = x (mod divisor) and 0 <= y < divisor, so x % divisor is y;
    or None. Each term's factor becomes its nearest value modulo divisor (128 -> 1 and
    -128 -> -1 for 127), which may be negative, and the constant is the one that puts y's
    range in [0, divisor). A window's index folds so: (8064 - r*128 + g) % 127 -> 63 - r + g
    for r, g < 64, where the non-negative rule gives up on the negative term."""
    terms = sum_terms(x)
    constant = sum(int(t.arg) for t in terms if t.op is Ops.CONST)
    reduced = []
    for term in terms:
        if term.op is Ops.CONST:
            continue
        factor = _factor(term) % divisor
        factor = factor - divisor if 2 * factor > divisor else factor
        if factor == 0:
            continue
        inner = term.src[0] if term.op is Ops.MUL and term.src[1].op is Ops.CONST else term
        reduced.append(inner if factor == 1 else inner * factor)
    variable = _sum(reduced, x.dtype)
    low = variable.vmin
    if not isinstance(low, int):
        return None
    shift = -((low + constant) // divisor) * divisor + constant  # = constant (mod divisor)
    if not 0 <= low + shift or variable.vmax + shift >= divisor:
        return None
    result = variable + shift if shift else variable
    return result if result is not x else None


def _split_by_common_factor(x: UOp, divisor: int) -> tuple[int, list[UOp], list[UOp]] | None:
    """x = f*q + s, where f (> 1, < divisor) divides `divisor` and the factor of every term of
    q, and 0 <= s < f: (f, the terms of f*q, the terms of s), or None. Then x // divisor is
    q // (divisor/f) and x % divisor is (q % (divisor/f))*f + s: s never carries into the next
    multiple of f. This is how a lane's index splits: (i*8 + lane) // 32 -> i // 4 and
    (i*8 + lane) % 32 -> (i % 4)*8 + lane for lane < 8, so the 8 lanes stay consecutive.
    Only non-negative terms (_split_by_divisor checked them)."""
    terms = sum_terms(x)
    common = math.gcd(divisor, *[_factor(t) for t in terms
                                 if t.op is not Ops.CONST and _factor(t) > 1])
    if common in (1, divisor):
        return None
    scaled = [t for t in terms if _factor(t) % common == 0]
    small = [t for t in terms if _factor(t) % common != 0]
    if not scaled or not small or _sum(small, x.dtype).vmax >= common:
        return None
    return common, scaled, small


def _reduce_factor(term: UOp, divisor: int) -> UOp:
    """i*f -> i*(f % divisor), for a non-negative i (the same value modulo divisor)."""
    factor = _factor(term)
    if term.op is not Ops.MUL or factor < divisor:
        return term
    return term.src[0] * (factor % divisor)


def recombine_divmod(total: UOp) -> UOp | None:
    """(x//c)*c + x%c -> x: a reshape splits an index into quotient and remainder, and a later
    reshape that merges them back produces exactly this sum. With a stride k on both,
    (x//c)*(c*k) + (x%c)*k -> x*k: a loop over a merged 16 x 64 reduction (a weight gradient
    summed over batch and positions) reads row x//64 at 64*128 floats and column x%64 at 128,
    which is x*128 without a division and a modulo in every step. (C's / and % truncate
    together, so (x/c)*c + x%c == x for every int x, negative ones too.)"""
    if not all(_may_pair(side) for side in total.src):
        return None
    terms = sum_terms(total)
    for k, term in enumerate(terms):
        if term.op is not Ops.MUL or term.src[0].op is not Ops.IDIV:
            continue
        x, c = term.src[0].src
        if c.op is not Ops.CONST or term.src[1].op is not Ops.CONST or c.arg <= 0 or \
                term.src[1].arg % c.arg != 0:
            continue
        stride = term.src[1].arg // c.arg
        remainder = next((j for j, t in enumerate(terms) if _is_remainder(t, x, c, stride)), None)
        if remainder is not None:
            rest = [t for j, t in enumerate(terms) if j not in (k, remainder)]
            return _sum([x if stride == 1 else x * stride, *rest], total.dtype)
    return None


def _is_remainder(term: UOp, x: UOp, c: UOp, stride: int) -> bool:
    """Is `term` (x%c)*stride (x%c itself for a stride of 1)?"""
    if term.op is Ops.MUL and term.src[1].op is Ops.CONST and term.src[1].arg == stride:
        term = term.src[0]
    elif stride != 1:
        return False
    return term.op is Ops.MOD and term.src[0] is x and term.src[1].op is Ops.CONST and \
        term.src[1].arg == c.arg


def _may_pair(side: UOp) -> bool:
    """Can one side of a sum hold a term of a new (x//c)*c, x%c pair? Rewriting goes bottom-up,
    so each side is already simplified and holds no pair itself: a new pair needs a term from
    each side, and a side that is a single other term rules it out. (So a sum grown one term
    at a time costs one look per step, not a walk over all of its terms.)"""
    if side.op is Ops.ADD:
        return True
    return side.op is Ops.MOD or (side.op is Ops.MUL and side.src[0].op in (Ops.IDIV, Ops.MOD))


def fold_compare_by_range(x: UOp, c: UOp) -> UOp | None:
    """x < c is known when x's range lies entirely on one side of c."""
    if x.vmax < c.arg:
        return UOp.const(dtypes.bool, True)
    if x.vmin >= c.arg:
        return UOp.const(dtypes.bool, False)
    return None


def drop_added_zero(x: UOp, zero: UOp) -> UOp | None:
    """x+0 -> x, except where IEEE floats say otherwise: -0.0 + 0.0 is +0.0, so for a float x
    only adding -0.0 leaves every x (-0.0, NaN and the infinities included) as it is."""
    if not dtypes.is_float(x.dtype) or math.copysign(1.0, zero.arg) < 0:
        return x
    return None


def _is_int(node: UOp) -> bool:
    return node.dtype.kind in ("int", "uint")


def fold_constant_sources(node: UOp) -> UOp | None:
    """The folding rule: an ALU op with sources, all of them constants, becomes a constant."""
    if node.src and all(source.op is Ops.CONST for source in node.src):
        return fold_constants(node)
    return None


def simplify_given_valid(index: UOp, valid: UOp | None) -> UOp:
    """An index read only where `valid` holds, simplified with what `valid` says of its loop
    counters. A concatenation is a sum of padded inputs: the third third of a 384-wide row
    reads its input where `!(g - 256 < 0)`, and there `g` runs over [256, 384) only, so the
    index's `((g - 256)/32 % 4)*32 + (g - 256)%32` is `g - 256` (the rules cannot see it
    for all g, where g - 256 may be negative). Each bound on a counter (`x + k < c` or
    `!(x + k < c)`, x a loop) narrows it: x becomes `x' + low` for a new counter x' over
    [0, high - low], the index is simplified, and x' becomes `x - low` again. The result
    equals the index wherever `valid` holds (elsewhere it is never read)."""
    if valid is None:
        return index
    bounds: dict[UOp, tuple[int, int]] = {}
    for clause in _clauses(valid):
        found = _counter_bound(clause)
        if found is not None:
            counter, low, high = found
            old_low, old_high = bounds.get(counter, (int(counter.vmin), int(counter.vmax)))
            bounds[counter] = (max(old_low, low), min(old_high, high))
    narrowed = {c: b for c, b in bounds.items() if b != (c.vmin, c.vmax) and b[0] <= b[1]}
    if not narrowed or not any(c in narrowed for c in index.toposort):
        return index
    inner = {c: UOp(Ops.RANGE, c.dtype, (), ("valid", c.arg[1], high - low + 1))
             for c, (low, high) in narrowed.items()}
    shifted = index.substitute({c: inner[c] + low for c, (low, _) in narrowed.items()})
    simplified = graph_rewrite(shifted, symbolic)
    return simplified.substitute({inner[c]: c + (-low) for c, (low, _) in narrowed.items()})


def _clauses(valid: UOp) -> list[UOp]:
    """The conditions and-ed together in `valid`."""
    clauses, stack = [], [valid]
    while stack:
        node = stack.pop()
        if node.op is Ops.AND and node.dtype == dtypes.bool:
            stack.extend(node.src)
        else:
            clauses.append(node)
    return clauses


def _counter_bound(clause: UOp) -> tuple[UOp, int, int] | None:
    """(loop counter, low, high) when `clause` is `x + k < c` or `!(x + k < c)` (written
    `(x + k < c) != True`) for a loop counter x of a fixed size; else None."""
    below = True
    if clause.op is Ops.CMPNE and clause.src[1].op is Ops.CONST and clause.src[1].arg is True:
        clause, below = clause.src[0], False
    if clause.op is not Ops.CMPLT or clause.src[1].op is not Ops.CONST:
        return None
    side, bound = clause.src[0], int(clause.src[1].arg)
    offset = 0
    if side.op is Ops.ADD and side.src[1].op is Ops.CONST:
        side, offset = side.src[0], int(side.src[1].arg)
    if side.op is not Ops.RANGE or not isinstance(side.arg[2], int):
        return None
    if below:  # x + k < c: x <= c - k - 1
        return side, int(side.vmin), bound - offset - 1
    return side, bound - offset, int(side.vmax)  # x + k >= c


def symbolic_rules() -> list[Rule]:
    """symbolic's table, in the order its rules are tried at each node. The pattern variables
    are local: each rule binds its own `x`, and no module-level `x` shadows a reader's."""
    x, y, c1, c2 = UPat.var("x"), UPat.var("y"), UPat.cvar("c1"), UPat.cvar("c2")
    return [
        ("fold constants", UPat(ALU, name="node", src=None), fold_constant_sources),
        ("x+0 -> x", UPat(Ops.ADD, src=(x, UPat(Ops.CONST, arg=0, name="zero"))), drop_added_zero),
        ("x*1 -> x", UPat(Ops.MUL, src=(x, UPat.const(1))), lambda x: x),
        ("x*0 -> 0 (ints)", UPat(Ops.MUL, src=(x, UPat.const(0))),
         lambda x: UOp.const(x.dtype, 0) if _is_int(x) else None),
        ("x//1 -> x", UPat(Ops.IDIV, src=(x, UPat.const(1))), lambda x: x),
        ("x%1 -> 0 (ints)", UPat(Ops.MOD, src=(x, UPat.const(1))),
         lambda x: UOp.const(x.dtype, 0) if _is_int(x) else None),
        ("--x -> x", UPat(Ops.NEG, src=(UPat(Ops.NEG, src=(x,)),)), lambda x: x),
        ("(x+c1)+c2 -> x+(c1+c2)", UPat(Ops.ADD, src=(UPat(Ops.ADD, src=(x, c1)), c2)),
         lambda x, c1, c2: x + UOp.const(x.dtype, c1.arg + c2.arg) if _is_int(x) else None),
        ("(x*c1)*c2 -> x*(c1*c2)", UPat(Ops.MUL, src=(UPat(Ops.MUL, src=(x, c1)), c2)),
         lambda x, c1, c2: x * UOp.const(x.dtype, c1.arg * c2.arg) if _is_int(x) else None),
        ("c+x -> x+c", UPat(Ops.ADD, src=(c1, x)),
         lambda c1, x: x + c1 if x.op is not Ops.CONST else None),
        ("(a*c+b)//c -> a+b//c", UPat(Ops.IDIV, src=(x, c1)), lambda x, c1: simplify_idiv(x, c1)),
        ("(x+y)*c -> x*c+y*c (ints)", UPat(Ops.MUL, src=(UPat(Ops.ADD, src=(x, y)), c1)),
         lambda x, y, c1: x * c1 + y * c1 if _is_int(x) else None),
        ("(x//c)*c + x%c -> x", UPat(Ops.ADD, name="total"),
         lambda total: recombine_divmod(total) if _is_int(total) else None),
        ("(a*c+b)%c -> b%c", UPat(Ops.MOD, src=(x, c1)), lambda x, c1: simplify_mod(x, c1)),
        ("x<c known from x's range", UPat(Ops.CMPLT, src=(x, c1)),
         lambda x, c1: fold_compare_by_range(x, c1) if _is_int(x) else None),
        ("x&True -> x", UPat(Ops.AND, src=(x, UPat.const(True))), lambda x: x),
        ("x&False -> False", UPat(Ops.AND, src=(x, UPat.const(False))),
         lambda x: UOp.const(dtypes.bool, False)),
        ("where(True, a, b) -> a", UPat(Ops.WHERE, src=(UPat.const(True), x, y)), lambda x, y: x),
        ("where(False, a, b) -> b", UPat(Ops.WHERE, src=(UPat.const(False), x, y)), lambda x, y: y),
    ]


symbolic = PatternMatcher("symbolic", symbolic_rules())
