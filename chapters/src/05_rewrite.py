# %% [markdown] id="rewrite-01"
# # Chapter 5 — Rewriting graphs: the pattern matcher
#
# A compiler pass is a table of rules: *when you see this shape of graph, build that instead*.
# tinygrad writes almost every pass this way — simplification, lowering, even parts of code
# generation — and so does tinyteach.
#
# **What you will learn**
# - `UPat` describes a shape of graph (op, sources, arg, a name to bind the match to);
# - `PatternMatcher` is an ordered table of named rules; `graph_rewrite` applies it bottom-up
#   until nothing changes;
# - constant folding and the `symbolic` rules that tidy chapter 4's index arithmetic;
# - recording every step with `record_rewrites()` and stepping through them with
#   `viz.rewrites`.
#
# **Where it lives:** [`tinyteach/ir/rewrite.py`](../tinyteach/ir/rewrite.py). It builds on
# [`ir/uop.py`](../tinyteach/ir/uop.py) and is used by [`codegen/lower.py`](../tinyteach/codegen/lower.py), which runs
# `symbolic` over every kernel's index math.

# %% id="rewrite-02"
import numpy as np

from tinyteach import Device, Tensor, dtypes

Device.DEFAULT = "CPU"      # the book's outputs must not depend on which devices exist here
Tensor.manual_seed(0)       # random tensors: the same numbers on every run
rng = np.random.default_rng(0)
# %load_ext tinyteach
import viz  # drawings: viz.graph, viz.schedule, viz.kernel, viz.rewrites
from tinyteach.ir.rewrite import (
    PatternMatcher,
    UPat,
    graph_rewrite,
    record_rewrites,
    symbolic,
)

# %% id="rewrite-03"
from tinyteach.ir.uop import Ops, UOp
from viz.rewrites import expression, steps_text

i = UOp(Ops.RANGE, dtypes.int32, (), ("g", 0, 4))   # 0 <= gidx0 < 4
j = UOp(Ops.RANGE, dtypes.int32, (), ("g", 1, 8))   # 0 <= gidx1 < 8

# %% [markdown] id="rewrite-04"
# ## Patterns
#
# `UPat(Ops.MUL, src=(UPat.var("x"), UPat.const(1)))` matches a `MUL` whose sources are
# anything (bound to the name `x`) and the constant 1. `match` fills a dict of bindings.
# Patterns on commutative ops match both orders, so `1 * x` matches too.

# %% id="rewrite-05"
times_one = UPat(Ops.MUL, src=(UPat.var("x"), UPat.const(1)))
for node in [i * 1, 1 * i, i * 2]:
    bindings = {}
    matched = times_one.match(node, bindings)
    print(f"{expression(node):<12} matches: {matched!s:<5}",
          {name: expression(n) for name, n in bindings.items()})

# %% [markdown] id="rewrite-06"
# A name used twice must bind the same node both times — that is how `x + x` is recognised
# (hash-consing makes "the same node" a cheap identity check):

# %% id="rewrite-07"
doubled = UPat(Ops.ADD, src=(UPat.var("x"), UPat.var("x")))
print(doubled.match(i + i, {}), doubled.match(i + j, {}))

# %% [markdown] id="rewrite-08"
# ## A pattern matcher and `graph_rewrite`
#
# A rule is `(name, pattern, build)`: when the pattern matches, `build(**bindings)` returns the
# replacement (or `None` for "no change after all"). `graph_rewrite` rebuilds the graph from
# the leaves up; at each node it applies the first matching rule, rewrites the result again,
# and stops when no rule matches anywhere.

# %% id="rewrite-09"
x = UPat.var("x")
tidy = PatternMatcher("tidy", [
    ("x+x -> x*2", UPat(Ops.ADD, src=(x, x)), lambda x: x * 2),
    ("x*1 -> x", UPat(Ops.MUL, src=(x, UPat.const(1))), lambda x: x),
])
before = (i * 1 + i * 1) + j
after = graph_rewrite(before, tidy)
print(expression(before), "->", expression(after))
assert after is i * 2 + j

# %% [markdown] id="rewrite-10"
# Note the order of events: `i*1` became `i` first (sources are rewritten before their users),
# which made the two sources of the `ADD` the *same node*, which let `x+x` fire. UOps are
# immutable: `before` is untouched, and `after` is a new graph that shares every unchanged node.
#
# ## Constant folding
#
# `symbolic` is tinyteach's simplifier. Its first rule folds any ALU op whose sources are all
# constants, using the Python reference semantics in `PYTHON_ALU` (C's integer division, with
# the dtype's wrap-around):

# %% id="rewrite-11"
c = UOp.const(dtypes.int32, 7)
folded = graph_rewrite((c * 6 - 1) // -4, symbolic)
print(folded, f"(41 / -4 = -10.25: C truncates toward zero; Python's // floors to {41 // -4})")
assert folded.arg == int((7 * 6 - 1) / -4) == -10 and (7 * 6 - 1) // -4 == -11
remainder = graph_rewrite((c * 6 - 1) % -4, symbolic)
print(remainder, f"(C's remainder takes the dividend's sign; Python's % gives {41 % -4})")
assert remainder.arg == 1
big = graph_rewrite(UOp.const(dtypes.int8, 100) + 100, symbolic)
print(big, "(int8 wraps around)")
assert big.arg == np.int8(np.array(200).astype(np.int8))

# %% [markdown] id="rewrite-12"
# ## The symbolic rules
#
# Here is the whole table, by name. Apart from folding, most rules are algebra on *integer*
# index arithmetic; several only hold for non-negative values, which is where `vmin`/`vmax`
# (chapter 3) come in.

# %% id="rewrite-13"
for name, _, _ in symbolic.rules:
    print(" ", name)

# %% [markdown] id="rewrite-41"
# `graph_rewrite` asks the table about every node, and most nodes match no rule, so the matcher
# skips rules before it tries to match them (tinygrad's `PatternMatcher` does the same). The
# rules are indexed by their pattern's op: `rules_for[Ops.MOD]` are the only rules a `MOD`
# meets. And a rule whose pattern names an op among the sources, as `x+0 -> x` needs a `CONST`,
# is skipped when no source has that op. Neither shortcut changes which rule fires first: both
# only skip rules that could not match.

# %% id="rewrite-42"
node = i * 8 + j
source_ops = {source.op for source in node.src}
for_add = symbolic.rules_for[Ops.ADD]
tried = [name for name, pattern, _ in for_add if pattern.source_ops <= source_ops]
print(f"{len(symbolic.rules)} rules; {len(for_add)} for an ADD; for {expression(node)}, "
      f"whose sources are {sorted(op.name for op in source_ops)}, {len(tried)} tried:", tried)


def first_rule(e: UOp) -> str | None:
    """The rule that fires at e when every rule is tried, in table order (no shortcuts)."""
    for name, pattern, build in symbolic.rules:
        bindings: dict[str, UOp] = {}
        if pattern.match(e, bindings) and build(**bindings) not in (None, e):
            return name
    return None


for e in [node, (i * 8 + j) % 8, i + 0, 3 + i, (i + 2) + 5, (i * 1) // 1, c * 2]:
    found = symbolic.rewrite(e)
    assert (found and found[0]) == first_rule(e), expression(e)

# %% [markdown] id="rewrite-14"
# The showcase rule: `(a*c + b) // c -> a + b // c`, and `b // c -> 0` when `0 ≤ b < c`. When no
# term is a multiple of `c`, a common factor may still do: if every term but a small rest is a
# multiple of `f`, `f` divides `c`, and the rest stays below `f`, the rest never carries, so
# `(b*2 + 1) // 8 -> b // 4` (and `% 8` keeps the rest outside: `(b % 4)*2 + 1`). That is what
# keeps a vector's lanes consecutive in an index such as `(i*8 + lane) // 32`. With
# `0 ≤ gidx1 < 8`:

# %% id="rewrite-15"
for e in [(i * 8 + j) // 8, (i * 8 + j) % 8, (i * 8 + j) // 8 % 4, (i * 16 + j * 2 + 1) // 8,
          (i * 8 + j).lt(32)]:
    print(f"{expression(e):<28} -> {expression(graph_rewrite(e, symbolic))}")

# %% [markdown] id="rewrite-16"
# A simplification must never change a value. Check each one by evaluating both sides for every
# `(gidx0, gidx1)` in range:

# %% id="rewrite-17"
import itertools

from tinyteach.ir.rewrite import PYTHON_ALU


def evaluate(node: UOp, env: dict[UOp, int]):
    if node.op is Ops.RANGE:
        return env[node]
    if node.op is Ops.CONST:
        return node.arg
    return PYTHON_ALU[node.op](*(evaluate(s, env) for s in node.src))

def same_everywhere(a: UOp, b: UOp) -> bool:
    return all(evaluate(a, {i: vi, j: vj}) == evaluate(b, {i: vi, j: vj})
               for vi, vj in itertools.product(range(4), range(8)))

for e in [(i * 8 + j) // 8 % 4, (i * 16 + j * 2 + 1) // 8, (i * 8 + j) % 8, (i * 10 + j) % 4]:
    assert same_everywhere(e, graph_rewrite(e, symbolic))
print("all simplifications keep their values")

# %% [markdown] id="rewrite-18"
# ## Recording rewrites
#
# `with record_rewrites() as log:` records every rule that fired inside the block, with the
# node before and after. (`DEBUG=5` prints the same steps as they happen.)

# %% id="rewrite-19"
from tinyteach.ir.view import index_into_buffer

base = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
view = base.reshape(12).reshape(3, 4).permute(1, 0)      # chapter 4's clumsy round trip
k0, k1 = (UOp(Ops.RANGE, dtypes.int32, (), ("g", n, s)) for n, s in enumerate(view.shape))
_, position, _ = index_into_buffer(view.uop, (k0, k1))
with record_rewrites() as log:
    simplified = graph_rewrite(position, symbolic)
print(steps_text(log.steps))

# %% [markdown] id="rewrite-20"
# `viz.rewrites` turns a log into an explorer: a slider (and ◀ ▶ buttons) over the steps,
# showing the rule's name, the formula before and after, and the two small graphs side by
# side. (Widgets need a live kernel; in a static view, the line of text below the widget is
# what you see.)

# %% id="rewrite-21"
viz.rewrites(log)

# %% [markdown] id="rewrite-22"
# Given a Tensor instead of a log, `viz.rewrites` lowers the tensor's kernels (chapter 7) while
# recording — nothing runs — so you can see what the simplifier did to a real kernel's index
# math. The text list of the same steps — notice where it stops: the last expression is
# `((x//4)*4) + (x'%4)`, which is just `x = (ridx0*6)+gidx0`. `symbolic` has the rule for it,
# "(x//c)*c + x%c -> x" (`recombine_divmod`), but it never fired: step 1 had already rewritten
# the `MOD`'s operand from `(ridx0*6)+gidx0` to `(ridx0*2)+gidx0` (the same value modulo 4), so by
# the time the `ADD` was rebuilt its two terms no longer shared the node `x`:

# %% id="rewrite-23"
out = base.reshape(2, 6).permute(1, 0).sum(1)
from viz.rewrites import collect_steps

steps = collect_steps(out)
print(steps_text(steps))
assert steps[0].rule == "(a*c+b)%c -> b%c"                          # step 1: the MOD's operand
assert "(x//c)*c + x%c -> x" not in [step.rule for step in steps]   # recombining never fired
viz.rewrites(out)


# %% [markdown] id="rewrite-33"
# ## Rule order: one rule can hide another's match
#
# `graph_rewrite` rewrites sources before their users, so a rule on a node always sees its sources
# in their simplified form. That is usually what you want (`x+x` fired above because `i*1` had
# become `i` first), but a rule that needs two of its sources to be *the same node* can be defeated
# by a rule that simplified one of them and not the other. Compilers call this the *phase-ordering
# problem*: the result depends on the order in which rules, or whole passes, run. Here is the
# kernel's index in miniature, with `x = ridx0*6 + gidx0`. Run alone, `symbolic` lets the `MOD`
# rule fire first; a pass that only recombines, run before `symbolic`, finds the match:

# %% id="rewrite-34"
def only(*names: str) -> PatternMatcher:
    """A table made of some of symbolic's rules, by name."""
    return PatternMatcher("+".join(names), [rule for rule in symbolic.rules if rule[0] in names])


recombine = only("(x//c)*c + x%c -> x")
r6 = UOp(Ops.RANGE, dtypes.int32, (), ("g", 0, 6))
r2 = UOp(Ops.RANGE, dtypes.int32, (), ("r", 0, 2))
x6 = r2 * 6 + r6
e = (x6 // 4) * 4 + x6 % 4
print("expression:               ", expression(e))
print("symbolic:                 ", expression(graph_rewrite(e, symbolic)))
recombined = graph_rewrite(e, recombine)
print("recombine, then symbolic: ", expression(graph_rewrite(recombined, symbolic)))
assert graph_rewrite(graph_rewrite(e, recombine), symbolic) is x6

# %% [markdown] id="rewrite-35"
# On the real kernel the order of whole passes is enough too. Its raw index, before step 1 of
# rewrite-23's log, is the same expression with only an outer `%12` around it; `recombine` first
# gives `x`, whose `%12` symbolic then drops (x is at most 11):

# %% id="rewrite-43"
g0 = UOp(Ops.RANGE, dtypes.int32, (), ("g", 0, 6))
r0 = UOp(Ops.RANGE, dtypes.int32, (), ("r", 0, 2))
_, raw, _ = index_into_buffer(base.reshape(2, 6).permute(1, 0).uop, (g0, r0))  # out's load
print("raw index:                ", expression(raw))
print("symbolic:                 ", expression(graph_rewrite(raw, symbolic)))
recombined_raw = graph_rewrite(graph_rewrite(raw, recombine), symbolic)
print("recombine, then symbolic: ", expression(recombined_raw))
assert recombined_raw is r0 * 6 + g0

# %% [markdown] id="rewrite-44"
# But an order of passes is chosen for the expressions one has seen. tinygrad meets the same
# problem by running several passes with different tables, in an order chosen by hand. The general
# cure is a rule that does not depend on the order at all, because it compares values, not nodes —
# exercise 3.

# %% [markdown] id="rewrite-36"
# ## Which passes of the book are tables
#
# A table of rules is the right shape for a pass when each rule can decide from what it sees: a
# node and its sources. Where a rule only needs the op, the table is a dict keyed by op — a
# pattern matcher whose every pattern is `UPat(op)` — and that is how three later passes are
# written: the gradient rules (chapter 2), each renderer's `code_for_op` (chapter 8) and the NUMPY
# device's ops (chapter 9). `symbolic` needs real patterns (`x*1` is a `MUL` *whose second source
# is the constant 1*), so it is a `PatternMatcher`; lowering (chapter 7) runs it over every
# kernel's index math.

# %% id="rewrite-37"
from tinyteach.render.c import CRenderer
from tinyteach.runtime.numpy import NUMPY_OPS
from tinyteach.tensor.gradient import GRADIENT_RULES

tables = {"symbolic (chapters 5 and 7)": symbolic, "gradient rules (chapter 2)": GRADIENT_RULES,
          "C's code_for_op (chapter 8)": CRenderer().code_for_op,
          "NUMPY's ops (chapter 9)": NUMPY_OPS}
for title, table in tables.items():
    if isinstance(table, PatternMatcher):
        print(f"{title:<30} {len(table.rules):>2} rules with patterns: a PatternMatcher")
    else:
        assert all(isinstance(op, Ops) for op in table)
        print(f"{title:<30} {len(table):>2} rules keyed by op: a dict")

# %% [markdown] id="rewrite-38"
# The other passes are walks, and the reason is the direction. `graph_rewrite` goes from the leaves
# up: when a rule sees a node, its sources are done and its users are not yet built. A rule that
# watches every `ADD` and `MUL` shows it — `shared` is seen first, before either of its two users:

# %% id="rewrite-39"
seen = []


def note(node: UOp) -> None:
    """A rule that changes nothing: it records the order in which nodes are visited."""
    seen.append(expression(node))


watch = PatternMatcher("watch", [("note ADD and MUL", UPat((Ops.ADD, Ops.MUL), name="node"), note)])
shared = i + j
graph_rewrite(shared * 2 + shared * 3, watch)
print("\n".join(seen))
assert seen[0] == expression(shared) and len(seen) == 4

# %% [markdown] id="rewrite-40"
# When the rule saw `shared`, nothing said that two nodes would read it. That is exactly what the
# scheduler (chapter 6) must know before it decides to store a value ("used by 2 kernels", "broadcast
# back"), so `find_realized` counts every node's users first and walks from the outputs *down*.
# Lowering (chapter 7) also walks from the store down, because a node's index comes from its user:
# a `PERMUTE` changes the index its source is read at. Both hand what is local back to a table —
# the index math they build goes through `symbolic`. tinygrad writes these passes as rules too, with
# a context object that carries what a rule cannot see; tinyteach keeps them as walks, which read
# in the one direction the information flows.

# %% [markdown] id="rewrite-24"
# ## Rules that never finish
#
# Nothing stops a table from containing rules that undo each other — the pattern matcher
# cannot know. `graph_rewrite` counts its steps and stops with an error instead of looping
# forever:

# %% id="rewrite-25"
a, y = UPat.var("a"), UPat.var("y")
flip_flop = PatternMatcher("flip-flop", [
    ("a+y -> y+a", UPat(Ops.ADD, src=(a, y)), lambda a, y: y + a if a is not y else None),
])
try:
    graph_rewrite(i + j, flip_flop, max_steps=50)
except RuntimeError as error:
    print("RuntimeError:", error)

# %% [markdown] id="rewrite-26"
# Why does it loop? `y + a` is a new node (hash-consing keeps `i+j` and `j+i` apart), and
# `ADD` is commutative, so the pattern matches it again — forever. The fix in practice is a canonical order: `symbolic` has `c+x -> x+c`
# (constants to the right) but never a rule that moves them back.
#
# ## Try it
#
# 1. Add a rule `x*2 -> x+x` to a new `PatternMatcher` and apply it to `(i*2)*2`. What comes
#    out, and why is it not `i+i+i+i`?
# 2. Write a rule that folds `x + (-x)` to `0` for integers, and check it with `same_everywhere`.
# 3. Make the recombination survive rule order. Write one `UPat` for `(x//c)*c + m`, where `m`
#    is any `MOD`, and a function that returns `x` when `m` is what `symbolic` makes of `x % c`
#    (compare normal forms, not the nodes as written). Check it on its own on `(k//4)*4 + k%4`,
#    then show that `symbolic` plus your rule simplifies the index of the kernel of
#    `base.reshape(2, 6).permute(1, 0).sum(1)` to `(ridx0*6)+gidx0`, where `symbolic` alone stops.

# %% [markdown] id="rewrite-27"
# #### Solution (click to show): exercise 1

# %% id="rewrite-28" jupyter={"source_hidden": true}
double = PatternMatcher("double", [("x*2 -> x+x", UPat(Ops.MUL, src=(x, UPat.const(2))),
                                    lambda x: x + x)])
result = graph_rewrite((i * 2) * 2, double)
# the inner i*2 becomes i+i first; then (i+i)*2 becomes (i+i)+(i+i): one shared node
print(expression(result))
assert result is (i + i) + (i + i)

# %% [markdown] id="rewrite-29"
# #### Solution (click to show): exercise 2

# %% id="rewrite-30" jupyter={"source_hidden": true}
cancel = PatternMatcher("cancel", [
    ("x+(-x) -> 0", UPat(Ops.ADD, src=(x, UPat(Ops.NEG, src=(x,)))),
     lambda x: UOp.const(x.dtype, 0) if dtypes.is_int(x.dtype) else None)])
e = (i * 3 + j) - (i * 3 + j)
zero = graph_rewrite(e, cancel)
assert zero.op is Ops.CONST and zero.arg == 0 and same_everywhere(e, zero)
print(expression(e), "->", expression(zero))

# %% [markdown] id="rewrite-31"
# #### Solution (click to show): exercise 3

# %% id="rewrite-32" jupyter={"source_hidden": true}
c, m = UPat.cvar("c"), UPat(Ops.MOD, name="m")
def recombine_by_value(x: UOp, c: UOp, m: UOp) -> UOp | None:
    """(x//c)*c + m -> x, when m is what symbolic makes of x%c: the match survives rule order."""
    if c.arg <= 0 or m.src[1] is not c or graph_rewrite(x % c, symbolic) is not m:
        return None
    return x
div_mod = PatternMatcher("div-mod", [
    ("x//c*c + x%c -> x (by value)",
     UPat(Ops.ADD, src=(UPat(Ops.MUL, src=(UPat(Ops.IDIV, src=(x, c)), c)), m)),
     recombine_by_value)])
k = UOp(Ops.RANGE, dtypes.int32, (), ("g", 0, 12))
assert graph_rewrite((k // 4) * 4 + k % 4, div_mod) is k       # on its own, no symbolic

# the kernel of rewrite-23: out[g] sums view[g, r] over r
view = base.reshape(2, 6).permute(1, 0)
g, r = UOp(Ops.RANGE, dtypes.int32, (), ("g", 0, 6)), UOp(Ops.RANGE, dtypes.int32, (), ("r", 0, 2))
_, position, _ = index_into_buffer(view.uop, (g, r))
print("symbolic:          ", expression(graph_rewrite(position, symbolic)))
print("symbolic + div_mod:", expression(graph_rewrite(position, symbolic + div_mod)))
assert graph_rewrite(position, symbolic + div_mod) is r * 6 + g
assert all(evaluate(position, {g: vg, r: vr}) == vr * 6 + vg for vg in range(6) for vr in range(2))
