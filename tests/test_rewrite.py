"""Chapter 5: UPat matching, PatternMatcher order, graph_rewrite, constant folding with C
semantics, the symbolic rules (checked by brute force over the index ranges) and recording."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from tinyteach.dtype import dtypes
from tinyteach.ir import rewrite
from tinyteach.ir.rewrite import (
    PatternMatcher,
    UPat,
    fold_constant_sources,
    fold_constants,
    graph_rewrite,
    record_rewrites,
    symbolic,
)
from tinyteach.ir.uop import Ops, UOp

I32 = dtypes.int32


def loop(number: int, size: int) -> UOp:
    return UOp(Ops.RANGE, I32, (), ("g", number, size))


def const(value, dtype=I32) -> UOp:
    return UOp.const(dtype, value)


def c_div(a: int, b: int) -> int:
    """C's integer division from its definition: the quotient truncated toward zero."""
    return 0 if b == 0 else math.trunc(a / b)


def reference(op: Ops, *args):
    """Python semantics of each op, written independently of rewrite.PYTHON_ALU."""
    a = args[0]
    table = {
        Ops.ADD: lambda: a + args[1], Ops.MUL: lambda: a * args[1], Ops.NEG: lambda: -a,
        Ops.IDIV: lambda: c_div(a, args[1]),
        Ops.MOD: lambda: 0 if args[1] == 0 else a - args[1] * c_div(a, args[1]),
        Ops.MAX: lambda: max(a, args[1]), Ops.CMPLT: lambda: a < args[1],
        Ops.CMPNE: lambda: a != args[1], Ops.AND: lambda: a & args[1],
        Ops.OR: lambda: a | args[1], Ops.XOR: lambda: a ^ args[1],
        Ops.WHERE: lambda: args[1] if a else args[2],
    }
    return table[op]()


def evaluate(expr: UOp, env: dict[UOp, int]):
    values: dict[UOp, object] = {}
    for n in expr.toposort:
        if n.op is Ops.RANGE:
            values[n] = env[n]
        elif n.op is Ops.CONST:
            values[n] = n.arg
        else:
            values[n] = reference(n.op, *(values[s] for s in n.src))
    return values[expr]


# ---- UPat ----

def test_upat_binds_names_and_checks_ops():
    i = loop(0, 4)
    expr = i * 8
    bindings: dict[str, UOp] = {}
    pattern = UPat(Ops.MUL, src=(UPat.var("x"), UPat.cvar("c")))
    assert pattern.match(expr, bindings)
    assert bindings == {"x": i, "c": const(8)}
    assert not UPat(Ops.ADD, src=(UPat.var("x"), UPat.cvar("c"))).match(expr, {})
    assert UPat((Ops.ADD, Ops.MUL)).match(expr, {})
    assert not UPat(Ops.MUL, dtype=dtypes.float32).match(expr, {})


def test_upat_matches_commutative_ops_either_way():
    i = loop(0, 4)
    pattern = UPat(Ops.ADD, src=(UPat.var("x"), UPat.cvar("c")))
    bindings: dict[str, UOp] = {}
    assert pattern.match(const(3) + i, bindings)  # written c + x, pattern says x + c
    assert bindings["x"] is i and bindings["c"].arg == 3
    # a non-commutative op does not get swapped
    assert not UPat(Ops.IDIV, src=(UPat.var("x"), UPat.cvar("c"))).match(const(3) // i, {})


def test_upat_repeated_name_means_same_node():
    i, j = loop(0, 4), loop(1, 4)
    same = UPat(Ops.ADD, src=(UPat.var("x"), UPat.var("x")))
    assert same.match(i + i, {})
    assert not same.match(i + j, {})


def test_upat_const_arg_distinguishes_bool_from_int():
    assert UPat.const(True).match(const(True, dtypes.bool), {})
    assert not UPat.const(True).match(const(1), {})
    assert UPat.const(0).match(const(0), {})


def test_failed_commutative_attempt_leaves_no_bindings():
    i = loop(0, 4)
    pattern = UPat(Ops.ADD, src=(UPat.cvar("c"), UPat(Ops.MUL, name="m")))
    bindings: dict[str, UOp] = {}
    assert not pattern.match(i + i, bindings)
    assert "c" not in bindings


# ---- PatternMatcher ----

def test_pattern_matcher_tries_rules_in_order():
    i = loop(0, 4)
    first = PatternMatcher("first", [
        ("a", UPat(Ops.ADD, name="n"), lambda n: const(1)),
        ("b", UPat(Ops.ADD, name="n"), lambda n: const(2)),
    ])
    assert first.rewrite(i + 1) == ("a", const(1))
    declines = PatternMatcher("declines", [
        ("a", UPat(Ops.ADD, name="n"), lambda n: None),   # None: this rule does not apply
        ("b", UPat(Ops.ADD, name="n"), lambda n: const(2)),
    ])
    assert declines.rewrite(i + 1) == ("b", const(2))
    assert declines.rewrite(i * 2) is None


def test_pattern_matchers_add_up():
    a = PatternMatcher("a", [("r1", UPat(Ops.ADD), lambda: None)])
    b = PatternMatcher("b", [("r2", UPat(Ops.MUL), lambda: None)])
    both = a + b
    assert [rule[0] for rule in both.rules] == ["r1", "r2"] and "a" in both.name


# ---- graph_rewrite ----

def test_graph_rewrite_reaches_a_fixed_point():
    # x + 1 -> x, applied repeatedly: ((i+1)+1)+1 -> i
    strip = PatternMatcher("strip", [
        ("x+1 -> x", UPat(Ops.ADD, src=(UPat.var("x"), UPat.const(1))), lambda x: x)])
    i = loop(0, 4)
    assert graph_rewrite(((i + 1) + 1) + 1, strip) is i


def test_graph_rewrite_rewrites_new_nodes_too():
    # a rule that builds a node another rule must rewrite
    rules = PatternMatcher("chain", [
        ("mul2 -> add", UPat(Ops.MUL, src=(UPat.var("x"), UPat.const(2))), lambda x: x + x),
        ("x+x -> neg", UPat(Ops.ADD, src=(UPat.var("x"), UPat.var("x"))), lambda x: -x),
    ])
    i = loop(0, 4)
    assert graph_rewrite(i * 2 + 5, rules) is (-i) + 5


def test_graph_rewrite_leaves_the_original_untouched():
    i = loop(0, 4)
    expr = (i + 0) * 1
    before = expr.toposort
    assert graph_rewrite(expr, symbolic) is i
    assert expr.toposort == before


def test_graph_rewrite_stops_a_rule_that_never_finishes():
    grow = PatternMatcher("grow", [
        ("x -> x+1", UPat(Ops.RANGE, name="x"), lambda x: loop(0, x.arg[2] + 1))])
    with pytest.raises(RuntimeError, match="grow"):
        graph_rewrite(loop(0, 1), grow, max_steps=50)


# ---- constant folding ----

@pytest.mark.parametrize("op", [Ops.ADD, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.CMPLT,
                                Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR])
def test_fold_binary_int_constants(op):
    for a, b in itertools.product((-7, -1, 0, 3, 7), (-2, 0, 1, 3)):
        node = const(a).alu(op, const(b))
        folded = graph_rewrite(node, symbolic)
        assert folded.op is Ops.CONST
        assert folded.arg == reference(op, a, b), (op, a, b)


def test_the_folding_rule_waits_until_every_source_is_a_constant():
    i = UOp(Ops.RANGE, I32, (), ("g", 0, 4))
    assert fold_constant_sources(const(3) + i) is None
    assert fold_constant_sources(UOp(Ops.RANGE, I32, (), ("g", 0, 4))) is None  # no sources
    assert fold_constant_sources(const(3) + const(4)).arg == 7


def test_symbolic_keeps_its_pattern_variables_to_itself():
    """Issue 12: the rules' `x`, `y`, `c1`, `c2` are local to symbolic_rules(), not module names."""
    module_patterns = [name for name, value in vars(rewrite).items() if isinstance(value, UPat)]
    assert module_patterns == []
    assert [name for name, _, _ in symbolic.rules] == [name for name, _, _ in
                                                       rewrite.symbolic_rules()]


def test_fold_wraps_around_like_the_dtype():
    big = const(2 ** 31 - 1)
    assert graph_rewrite(big + 1, symbolic).arg == -2 ** 31
    small = UOp.const(dtypes.uint8, 250)
    assert graph_rewrite(small + UOp.const(dtypes.uint8, 10), symbolic).arg == 4
    assert graph_rewrite(UOp.const(dtypes.int8, -128) // UOp.const(dtypes.int8, -1),
                         symbolic).arg == -128


def test_fold_float_and_where_and_cast():
    a, b = const(1.5, dtypes.float32), const(2.25, dtypes.float32)
    assert graph_rewrite(a * b, symbolic).arg == 1.5 * 2.25
    cond = const(True, dtypes.bool)
    assert graph_rewrite(cond.where(a, b), symbolic) is a
    cast = UOp(Ops.CAST, I32, (const(-3.7, dtypes.float32),))
    assert graph_rewrite(cast, symbolic).arg == -3  # C truncates toward zero
    reciprocal = UOp(Ops.RECIPROCAL, dtypes.float32, (const(0.0, dtypes.float32),))
    assert fold_constants(reciprocal).arg == math.inf


def test_transcendentals_are_left_to_the_device():
    node = UOp(Ops.EXP2, dtypes.float32, (const(1.0, dtypes.float32),))
    assert graph_rewrite(node, symbolic) is node


# ---- the symbolic rules, checked by brute force ----

def agree_everywhere(original: UOp, simplified: UOp, ranges: list[UOp]) -> None:
    for values in itertools.product(*(range(r.arg[2]) for r in ranges)):
        env = dict(zip(ranges, values))
        assert evaluate(simplified, env) == evaluate(original, env), env


I, J, K = loop(0, 4), loop(1, 8), loop(2, 3)

SYMBOLIC_CASES = [
    ((I * 8 + J) // 8, I),
    ((I * 8 + J) % 8, J),
    ((J + I * 8) // 8, I),
    (I * 8 + J + 0, I * 8 + J),
    ((I * 1) // 1, I),
    (I % 1, const(0)),
    (I * 0, const(0)),
    (UOp(Ops.NEG, I32, (UOp(Ops.NEG, I32, (I,)),)), I),
    ((I + 2) + 3, I + 5),
    ((I * 2) * 4, I * 8),
    (3 + I, I + 3),
    (J // 8, const(0)),
    (J % 8, J),
    (I.lt(4), const(True, dtypes.bool)),
    (I.lt(0), const(False, dtypes.bool)),
]


@pytest.mark.parametrize("original, expected", SYMBOLIC_CASES,
                         ids=[str(n) for n in range(len(SYMBOLIC_CASES))])
def test_symbolic_rule(original, expected):
    simplified = graph_rewrite(original, symbolic)
    assert simplified is expected
    agree_everywhere(original, simplified, [I, J])


@pytest.mark.parametrize("build", [
    lambda: ((I * 24 + J * 3 + K) // 3) % 8,
    lambda: (I * 24 + J * 3 + K) // 24,
    lambda: (I * 6 + K * 2 + 1) // 4,
    lambda: (I * 6 + K * 2 + 1) % 4,
    lambda: ((I * 8 + J) * 3 + K) % 12,
    lambda: (I + J) // 3 + (I + J) % 3,
    lambda: (I * 8 + J).lt(20),
    lambda: ((I * 8 + J) // 8).lt(1),
    lambda: (I * -2 + J) // 2,
    lambda: (I * -2 + J) % 3,
    lambda: (J + -4) // 2,
])
def test_symbolic_keeps_values(build):
    original = build()
    simplified = graph_rewrite(original, symbolic)
    agree_everywhere(original, simplified, [I, J, K])


def test_symbolic_simplifies_what_views_produce():
    # a (4, 8) buffer reshaped to (32,) and back: index math collapses to the plain index
    flat = I * 8 + J
    row, col = (flat // 8) % 4, flat % 8
    assert graph_rewrite(row * 8 + col, symbolic) is I * 8 + J


# ---- recording ----

def test_record_rewrites_lists_every_step():
    i = loop(0, 4)
    expr = (i * 8 + 3) // 8
    with record_rewrites() as log:
        result = graph_rewrite(expr, symbolic)
    assert result is i
    assert log.steps, "the rewrite was recorded"
    assert all(step.pass_name == "symbolic" for step in log.steps)
    assert "(a*c+b)//c -> a+b//c" in [step.rule for step in log.steps]
    assert log.steps[0].before is expr or any(step.before is expr for step in log.steps)
    assert log.steps[-1].after is i
    for step in log.steps:
        assert step.before is not step.after


def test_recording_is_off_outside_the_block():
    with record_rewrites() as log:
        pass
    graph_rewrite((loop(0, 4) + 0), symbolic)
    assert log.steps == []


def test_nested_recorders_both_see_steps():
    with record_rewrites() as outer:
        with record_rewrites() as inner:
            graph_rewrite(loop(0, 4) * 1, symbolic)
    assert [s.rule for s in outer.steps] == [s.rule for s in inner.steps] == ["x*1 -> x"]


def test_debug_5_prints_rewrites(capsys):
    from tinyteach.helpers import Context
    with Context(DEBUG=5):
        graph_rewrite(loop(0, 4) * 1, symbolic)
    assert "x*1 -> x" in capsys.readouterr().out


def random_index_expression(rng, depth: int) -> UOp:
    """Index-like arithmetic: sums, products, // and % by constants (some negative)."""
    if depth == 0 or rng.random() < 0.25:
        choice = int(rng.integers(0, 4))
        return [I, J, K, const(int(rng.integers(-3, 9)))][choice]
    a = random_index_expression(rng, depth - 1)
    kind = int(rng.integers(0, 5))
    constant = int(rng.choice([-3, -1, 1, 2, 3, 4, 8]))
    if kind == 0:
        return a + random_index_expression(rng, depth - 1)
    if kind == 1:
        return a * constant
    if kind == 2:
        return a // constant
    if kind == 3:
        return a % constant
    return a.lt(constant).where(a, random_index_expression(rng, depth - 1))


@pytest.mark.parametrize("seed", range(40))
def test_symbolic_keeps_values_of_random_expressions(seed):
    import numpy as np
    rng = np.random.default_rng(seed)
    original = random_index_expression(rng, 4)
    agree_everywhere(original, graph_rewrite(original, symbolic), [I, J, K])


@pytest.mark.parametrize("device", ["NUMPY", "CPU"])
def test_adding_zero_keeps_ieee_signed_zeros(device):
    """-0.0 + 0.0 is +0.0, so the simplifier may drop `+ 0` only for ints (and `+ -0.0`)."""
    from tinyteach import Tensor
    x = np.array([-0.0, 0.0, np.nan, -np.inf, 2.5], dtype=np.float32)
    for zero in (0.0, -0.0):
        got = (Tensor(x, device=device) + zero).numpy()
        expected = x + np.float32(zero)
        np.testing.assert_array_equal(got, expected)
        assert list(np.signbit(got)) == list(np.signbit(expected))
    ints = (Tensor(np.array([-3, 7], dtype=np.int32), device=device) + 0).numpy()
    assert ints.tolist() == [-3, 7]


# ---- division by a common factor (issue 25) ----

def test_a_lane_below_the_common_factor_never_carries():
    """(i*8 + lane) // 32 -> i // 4 and % 32 -> (i % 4)*8 + lane: the lanes stay consecutive,
    so a head-permuted tensor's load vectorizes. No IDIV or MOD keeps the lane inside it."""
    i, lane = loop(0, 16), UOp(Ops.RANGE, I32, (), ("v", 1, 8))
    quotient = graph_rewrite((i * 8 + lane) // 32, symbolic)
    remainder = graph_rewrite((i * 8 + lane) % 32, symbolic)
    assert quotient is graph_rewrite(i // 4, symbolic)
    assert lane in remainder.src  # (i % 4)*8 + lane: the lane is added last, outside any MOD
    assert all(lane not in n.src for n in remainder.toposort if n.op in (Ops.IDIV, Ops.MOD))


def test_division_by_a_common_factor_by_brute_force():
    """Every value of the loop counters, for sums g*f1 + r*f2 + lane + c divided by d: the rule
    applies where it may (f divides d, the rest stays below f) and the value never changes."""
    from tinyteach.codegen.plan import index_value
    g, r, lane = loop(0, 16), loop(1, 5), UOp(Ops.RANGE, I32, (), ("v", 2, 8))
    rng = np.random.default_rng(25)
    for _ in range(150):
        f1, f2 = (int(v) for v in rng.choice([1, 2, 3, 4, 8, 16, 32], 2))
        c, d = int(rng.integers(0, 40)), int(rng.choice([2, 3, 4, 8, 12, 16, 24, 32, 64]))
        total = g * f1 + r * f2 + lane + c
        for op in (Ops.IDIV, Ops.MOD):
            simplified = graph_rewrite(total.alu(op, const(d)), symbolic)
            for gv, rv, lv in itertools.product(range(16), range(5), range(8)):
                value = gv * f1 + rv * f2 + lv + c
                expected = value // d if op is Ops.IDIV else value % d
                assert index_value(simplified, {g: gv, r: rv, lane: lv}) == expected, \
                    (f1, f2, c, d, op, gv, rv, lv)


def test_a_window_index_with_a_negative_term_folds_its_mod():
    """tril's mask reads window g of a padded row at 8064 - r*128 + g (r, g < 64): the sum is
    never negative, though one term is, and its remainder by 127 is 63 - r + g, below 127.
    So no MOD is left, and the causal mask is a comparison of two counters."""
    r, g = loop(0, 64), loop(1, 64)
    folded = graph_rewrite((UOp.const(I32, 8064) + (-r) * 128 + g) % 127, symbolic)
    assert all(n.op is not Ops.MOD for n in folded.toposort)


def test_mod_of_a_sum_with_negative_terms_by_brute_force():
    """Sums c + g*f1 - r*f2 + lane that are never negative, by d: a remainder is rewritten only
    to a congruent sum whose range lies in [0, d), so every value of the counters agrees."""
    from tinyteach.codegen.plan import index_value
    g, r, lane = loop(0, 9), loop(1, 5), UOp(Ops.RANGE, I32, (), ("v", 2, 4))
    rng = np.random.default_rng(7)
    for _ in range(200):
        f1, f2 = (int(v) for v in rng.choice([1, 2, 3, 7, 8, 15, 16, 17, 33], 2))
        d = int(rng.choice([2, 3, 5, 7, 8, 15, 16, 17, 32, 64]))
        c = 4 * f2 + int(rng.integers(0, 40))  # so c - r*f2 >= 0
        total = UOp.const(I32, c) + g * f1 + (-r) * f2 + lane
        simplified = graph_rewrite(total % d, symbolic)
        for gv, rv, lv in itertools.product(range(9), range(5), range(4)):
            expected = (c + gv * f1 - rv * f2 + lv) % d
            assert index_value(simplified, {g: gv, r: rv, lane: lv}) == expected, \
                (f1, f2, c, d, gv, rv, lv)


def test_a_merged_index_with_a_stride_recombines() -> None:
    """(x//64)*8192 + (x%64)*128 -> x*128: a loop over a merged 16 x 64 reduction reads rows of
    64 * 128 floats and columns of 128, which is x*128 (no division, no modulo), for every
    x, negative ones too (C's / and % truncate together); a stride that does not match stays."""
    x = UOp(Ops.RANGE, dtypes.int32, (), ("r", 0, 1024))
    merged = (x // 64) * 8192 + (x % 64) * 128 + 5
    assert graph_rewrite(merged, symbolic) is graph_rewrite(x * 128 + 5, symbolic)
    mismatched = (x // 64) * 8192 + (x % 64) * 64
    assert Ops.MOD in {n.op for n in graph_rewrite(mismatched, symbolic).toposort}
    for value in (-1000, -65, -64, -1, 0, 1, 63, 64, 1023):
        assert rewrite._c_idiv(value, 64) * 8192 + rewrite._c_mod(value, 64) * 128 == value * 128


def test_an_index_read_only_where_valid_is_simplified_with_its_bounds() -> None:
    """Where `!(g - 256 < 0)` guards a read, g runs over [256, 384): the index
    ((g - 256)//32 % 4)*32 + (g - 256)%32 is g - 256 there (not for every g: below 256 it is
    negative, and // and % truncate). Equal wherever the guard holds; a guard on another
    counter, or none, leaves the index as it is."""
    g = UOp(Ops.RANGE, dtypes.int32, (), ("g", 2, 384))
    other = UOp(Ops.RANGE, dtypes.int32, (), ("g", 1, 64))
    shifted = g + -256
    index = ((shifted // 32) % 4) * 32 + shifted % 32
    valid = shifted.lt(0).ne(True) & shifted.lt(128)
    simplified = rewrite.simplify_given_valid(graph_rewrite(index, symbolic), valid)
    assert {n.op for n in simplified.toposort} & {Ops.IDIV, Ops.MOD} == set()
    for value in range(256, 384):
        assert _evaluate(simplified, {g: value}) == _evaluate(index, {g: value}) == value - 256
    assert rewrite.simplify_given_valid(index, None) is index
    assert rewrite.simplify_given_valid(index, other.lt(3)) is index


def _evaluate(node: UOp, values: dict[UOp, int]) -> int:
    """An integer index's value for the given loop counters (C's / and %)."""
    if node in values:
        return values[node]
    if node.op is Ops.CONST:
        return int(node.arg)
    a, b = (_evaluate(s, values) for s in node.src)
    return {Ops.ADD: a + b, Ops.MUL: a * b, Ops.IDIV: rewrite._c_idiv(a, b) if b else 0,
            Ops.MOD: rewrite._c_mod(a, b) if b else 0}[node.op]
