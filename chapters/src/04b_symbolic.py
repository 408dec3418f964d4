# %% [markdown] id="sym-01"
# # Chapter 4b — Symbolic shapes: one kernel for every length
#
# A language model reads a sentence one token at a time: its attention runs over 1, then 2,
# then 3… positions. With plain int shapes every new length is a new graph, a new kernel, a new
# compile. tinygrad's answer, and tinyteach's, is a *symbolic* size: an integer `Variable` that
# stands in a shape, compiled once, given its value when the kernel launches.
#
# **What you will learn**
# - `Variable("n", 1, 64)`, `.bind(value)` and `var_vals`: a size with a name, a range and, for
#   one run, a value; shapes such as `(n, 4)` from `x[:n]`, `shrink`, `reshape`, `Tensor.ones`;
# - where the variable lives in the IR (`DEFINE_VAR`, inside movement ops' args and loop
#   bounds) and in the generated C (an `int n` parameter and a loop `gidx0 < n`);
# - how the simplifier uses a variable's range (`vmin`, `vmax`) to fold divisions and
#   comparisons, and why the range is also what every buffer is sized for;
# - one compiled kernel for every length, and one TinyJit capture replayed for every length —
#   the trick behind the GPT's KV cache in chapter 11b;
# - what happens to a value outside the range: a clear error, never a write past a buffer.
#
# **Where it lives:** the symbolic half of [`tinyteach/ir/uop.py`](../tinyteach/ir/uop.py)
# (`Variable`, `bind`, `unbind_graph`, `sym_*`, `vmin`/`vmax`), movement ops over symbolic sizes
# in [`tinyteach/ir/view.py`](../tinyteach/ir/view.py), and their users: `engine/realize.py` (var_vals at
# launch), `codegen/lower.py` (symbolic loop bounds) and `engine/jit.py` (replay with new values).

# %% id="sym-02"
import numpy as np

from tinyteach import Device, Tensor, TinyJit, Variable

Device.DEFAULT = "CPU"      # generated C, compiled here: the kernels below are printed as C
Tensor.manual_seed(0)
rng = np.random.default_rng(0)

from tinyteach.codegen.lower import lower
from tinyteach.engine.realize import build_schedule, record_launches, runner_cache
from tinyteach.ir.rewrite import graph_rewrite, record_rewrites, symbolic
from tinyteach.ir.uop import Ops, pretty, unbind_graph, variables_of
from tinyteach.opt.heuristic import heuristic_plan
from viz.rewrites import expression  # an integer UOp as a formula: ((n*4)+k)

# %% [markdown] id="sym-03"
# ## A Variable, its range and its value
#
# `Variable("n", 1, 64)` is one UOp, a `DEFINE_VAR` whose arg is its name and its range. It is
# an int32 expression like any other: `n * 4` and `n + 1` are ordinary `MUL` and `ADD` nodes,
# and every node knows the smallest and largest value it can take (`vmin`, `vmax`, worked out
# from its sources, as chapter 3's "Value bounds" showed for loop counters).

# %% id="sym-04"
n = Variable("n", 1, 64)
print(n.op, n.arg, n.dtype.name)
print(f"n*4 in [{(n * 4).vmin}, {(n * 4).vmax}],  n+1 in [{(n + 1).vmin}, {(n + 1).vmax}],  "
      f"n//8 in [{(n // 8).vmin}, {(n // 8).vmax}]")
assert n.op is Ops.DEFINE_VAR and n.arg == ("n", 1, 64)
assert ((n * 4).vmin, (n * 4).vmax) == (4, 256) and (n // 8).vmax == 8

# %% [markdown] id="sym-05"
# `.bind(5)` gives the variable a value *for one run*: a `BIND` node holding the variable and a
# constant. The bound variable prints by its name — the name is what stays the same from one
# run to the next; the value is what changes. `unbind()` takes it apart again.

# %% id="sym-06"
five = n.bind(5)
print(pretty(five))
print("unbind():", five.unbind(), "  printed as:", five)
assert five.op is Ops.BIND and five.unbind() == (n, 5)

# %% [markdown] id="sym-07"
# ## A bound variable in a shape
#
# A bound variable goes wherever a size goes. Slicing with it (`x[:n]`) is a `shrink`;
# `reshape` takes it; `Tensor.ones(n)` is a constant expanded to n. The shapes print the size
# by name, and the values are those of n = 5. Each result is checked against numpy.

# %% id="sym-08"
x_np = np.arange(64, dtype=np.float32)
x = Tensor(x_np).realize()

first = x[:five]                                     # the same as x.shrink(((0, five),))
assert first.uop is x.shrink(((0, five),)).uop
h = Variable("h", 1, 32)                             # 2h elements fit in x for every h
pairs = x[:h.bind(5) * 2].reshape(h.bind(5), 2)      # 2h elements, read as h rows of 2
ones = Tensor.ones(five)
for name, t, expected in (("x[:n]", first, x_np[:5]),
                          ("x[:2h].reshape(h, 2)", pairs, x_np[:10].reshape(5, 2)),
                          ("Tensor.ones(n)", ones, np.ones(5, np.float32))):
    print(f"{name:<22} shape {str(t.shape):<8} -> {t.numpy().tolist()}")
    np.testing.assert_array_equal(t.numpy(), expected)

# %% [markdown] id="sym-09"
# The graph holds the size *inside* the movement op's arg: `SHRINK arg=((0, n),)`. This graph
# still has the bound variable in it, value and all. Before anything is compiled, `unbind_graph`
# replaces each `BIND` by its bare `DEFINE_VAR` and collects the values into **var_vals**, a
# plain `{name: value}` dict. The graph that remains is the same for every value of n.

# %% id="sym-10"
y = first * 2 + 1
print(pretty(y.uop))
roots, var_vals = unbind_graph([y.uop])
print("var_vals:", var_vals)
assert var_vals == {"n": 5}
assert not any(node.op is Ops.BIND for node in roots[0].toposort)
assert roots == unbind_graph([(x[:n.bind(17)] * 2 + 1).uop])[0]   # n = 17: the same graph

# %% [markdown] id="sym-11"
# ## DEFINE_VAR in the kernel
#
# The scheduler (chapter 6) makes one kernel of `x[:n] * 2 + 1`. Its AST reads the input through
# `SHRINK ((0, n),)` — n is the `DEFINE_VAR`, not a value — and its name, `E_n`, has the size in
# it where a fixed-size kernel would have a number. The buffers are sized for n's *largest*
# value: `DEFINE_GLOBAL arg=(0, 64)` holds 64 floats, enough for every n the kernel will see.

# %% id="sym-12"
(item,) = build_schedule(roots, "CPU", var_vals).items
print(item.name, " var_vals:", item.var_vals)
print(pretty(item.ast))
print("variables of the AST:", [(v.op.name, v.arg) for v in variables_of([item.ast])])
assert item.name == "E_n" and item.var_vals == {"n": 5}

# %% [markdown] id="sym-13"
# Lowering (chapter 7) turns the output shape `(n,)` into one loop. Its bound is the variable:
# `RANGE ('g', 0, n)`, and the program lists n among its `variables`. (A kernel over a symbolic
# size is lowered without optimizations: upcasting and unrolling split loops of *known* sizes.)

# %% id="sym-14"
program = lower(item.ast, heuristic_plan(item.ast))
print(program)
print("variables:", [v.arg for v in program.variables])
(loop,) = [u for u in program.uops if u.op is Ops.RANGE]
assert loop.arg[2] is n and program.variables == (n,)

# %% [markdown] id="sym-15"
# The C source: after the buffer pointers, one more parameter, `const int n`, and the loop runs
# `gidx0 < n`. This is the program that runs — the one the launch below used, taken from its
# runner.

# %% id="sym-16"
with record_launches() as launches:
    out = y.realize()
(launch,) = launches
print(launch.runner.source)
print("launched with", launch.var_vals)
assert "const int n" in launch.runner.source and "gidx0 < n;" in launch.runner.source
np.testing.assert_array_equal(out.numpy(), x_np[:5] * 2 + 1)

# %% [markdown] id="sym-17"
# ## Bounds in the simplifier
#
# Index arithmetic is full of `//`, `%` and `<` (chapter 4's views, chapter 5's rules), and
# the rules that remove them ask a node's range. Take `(n*4 + k) // 4`, `(n*4 + k) % 4` and
# `k < 4` for a second variable k. If k lies in [0, 3], then k // 4 is 0, k % 4 is k and k < 4
# is always true; if k may be 4, none of that holds. The same rules, the same expressions,
# two ranges for k — and the log of `record_rewrites` shows which rule fired:

# %% id="sym-18"
def simplify(node):
    with record_rewrites() as log:
        result = graph_rewrite(node, symbolic)
    return result, [step.rule for step in log.steps]


results = {}
for high in (3, 4):
    k = Variable("k", 0, high)
    print(f"k in [0, {high}]:")
    for formula in ((n * 4 + k) // 4, (n * 4 + k) % 4, k.lt(4)):
        result, rules = simplify(formula)
        results[(high, expression(formula))] = expression(result)
        print(f"  {expression(formula):<16} -> {expression(result):<12} rules: {rules}")

assert results[(3, "(((n*4)+k)//4)")] == "n" and results[(4, "(((n*4)+k)//4)")] == "(n+(k//4))"
assert results[(3, "(((n*4)+k)%4)")] == "k" and results[(4, "(((n*4)+k)%4)")] == "(k%4)"
assert results[(3, "(k<4)")] == "True" and results[(4, "(k<4)")] == "(k<4)"

# %% [markdown] id="sym-19"
# With k ≤ 3, `x<c known from x's range` fires (k's vmax, 3, is below 4) and the division rule
# drops its remainder `k//4`, because `k.vmax < 4`. With k ≤ 4 the comparison rule does not fire
# at all: nothing is known. (`h` above worked the same way: `x[:2h]` was allowed because
# 2h's vmax, 64, fits in x.) A variable's range is a promise the whole stack relies on, and
# nothing inside a kernel re-checks it: `E_n` above writes `data0[gidx0]` for every
# `gidx0 < n` into a buffer of 64 floats. That is why a value outside the range must never
# reach a kernel (the last section).

# %% [markdown] id="sym-20"
# ## One kernel for every length
#
# Run `x[:n] * 3 - 1` for six lengths. The runner cache (compiled programs, by kernel AST) grows
# by one entry, and every launch ran the very same compiled program, each with its own n.
# Beside it, the same computation with plain int slices, `x[:length]`: one compile per length.

# %% id="sym-21"
lengths = (1, 3, 8, 20, 33, 64)
before = len(runner_cache)
symbolic_launches = []
for length in lengths:
    with record_launches() as launches:
        result = (x[:n.bind(length)] * 3 - 1).realize()
    np.testing.assert_array_equal(result.numpy(), x_np[:length] * 3 - 1)
    (launch,) = launches
    symbolic_launches.append(launch)
    print(f"n = {length:>2}: kernel {launch.runner.name}, var_vals {launch.var_vals}")
runners = [launch.runner for launch in symbolic_launches]
symbolic_compiles = len(runner_cache) - before
print("compiled with a Variable:", symbolic_compiles, "kernel for", len(lengths), "lengths")
assert symbolic_compiles == 1 and all(r is runners[0] for r in runners)

before = len(runner_cache)
names = []
for length in lengths:
    with record_launches() as launches:
        result = (x[:length] * 3 - 1).realize()
    np.testing.assert_array_equal(result.numpy(), x_np[:length] * 3 - 1)
    names.append(launches[0].runner.name)
int_compiles = len(runner_cache) - before
print("compiled with int sizes:", int_compiles, "kernels:", ", ".join(names))
assert int_compiles == len(lengths)

# %% [markdown] id="sym-22"
# ## The JIT over variable sizes
#
# TinyJit (chapter 10) captures a function's kernel launches on its second call and replays
# them afterwards without running the Python. An input of another shape is an error there —
# unless the size is a bound Variable passed as an argument: then the capture is made over the
# symbolic size, and each replay passes the new value.
#
# Here is the core of a KV cache, as chapter 11b's GPT uses it (`tinyteach/nn/transformer.py`):
# keys and values preallocated for 16 positions; at position p a query attends over the first
# p+1 of them, `keys[:p+1]`. The length grows by one each call; the capture happens once.

# %% id="sym-23"
MAX_POSITIONS, WIDTH = 16, 4
keys_np = rng.standard_normal((MAX_POSITIONS, WIDTH)).astype(np.float32)
values_np = rng.standard_normal((MAX_POSITIONS, WIDTH)).astype(np.float32)
keys, values = Tensor(keys_np).realize(), Tensor(values_np).realize()
position = Variable("pos", 0, MAX_POSITIONS - 1)
body_runs = 0


@TinyJit
def attend(query: Tensor, pos) -> Tensor:
    global body_runs
    body_runs += 1
    seen_keys, seen_values = keys[:pos + 1], values[:pos + 1]   # (pos+1, 4): symbolic
    weights = (seen_keys @ query).softmax(0)                    # one weight per position
    return (weights.reshape(pos + 1, 1) * seen_values).sum(0).realize()


def attend_reference(query: np.ndarray, p: int) -> np.ndarray:
    scores = keys_np[:p + 1] @ query
    weights = np.exp(scores - scores.max())
    return (weights / weights.sum()) @ values_np[:p + 1]


compiled = [len(runner_cache)]  # the runner cache's size before each call, and at the end
for p in range(MAX_POSITIONS):
    query = rng.standard_normal(WIDTH).astype(np.float32)
    out = attend(Tensor(query), position.bind(p))
    np.testing.assert_allclose(out.numpy(), attend_reference(query, p), rtol=1e-5, atol=1e-6)
    compiled.append(len(runner_cache))
new_kernels = [after - before for before, after in zip(compiled, compiled[1:])]
print(f"{MAX_POSITIONS} calls, lengths 1..{MAX_POSITIONS}: the Python body ran {body_runs} "
      f"times; kernels compiled by each call: {new_kernels}")
print("the capture:", len(attend.captured.launches), "kernels, symbolic:",
      attend.captured.symbolic, " last replay's var_vals:", attend.captured.var_vals)
assert body_runs == 2 and attend.captured.symbolic
assert new_kernels[0] == len(attend.captured.launches) and sum(new_kernels[1:]) == 0
assert attend.captured.var_vals == {"pos": MAX_POSITIONS - 1}

# %% [markdown] id="sym-24"
# Every call was checked against numpy, the 14 replays included: the body ran twice (call 1
# ran, call 2 captured), and the kernels were compiled once, all of them by the first call. In the GPT the
# same holds for a whole decoder step, with the cache written at slot `pos` in place.

# %% [markdown] id="sym-25"
# ## Bad input
#
# A range is a promise: buffers are sized for the largest value and the simplifier folded
# comparisons with it. So a value outside the range is refused wherever it could enter:
#
# - `bind` checks the value against the range;
# - a movement op must fit for *every* value in the range: `x[:m]` on 64 elements is refused
#   for an m that may be 100, even when the value bound today is 10;
# - the launch checks every value again, for code that calls a compiled kernel directly
#   (`launch_kernel`), where 1000 would write past a 64-element buffer;
# - a JIT captured for `Variable("pos", 0, 15)` refuses another Variable of the same name and a
#   wider range.

# %% id="sym-26"
from tinyteach.engine.jit import JitError
from tinyteach.engine.realize import launch_kernel


def error_of(attempt) -> str:
    try:
        attempt()
    except (ValueError, JitError) as error:
        return f"{type(error).__name__}: {error}"
    raise AssertionError("no error")


wide = Variable("pos", 0, 99)
checks = {
    "n.bind(65)": lambda: n.bind(65),
    "x[:m], m <= 100": lambda: x[:Variable("m", 1, 100).bind(10)],
    "launch with n=1000": lambda: launch_kernel(runners[0], symbolic_launches[0].buffers,
                                                {"n": 1000}),
    "jit, a wider pos": lambda: attend(Tensor(query), wide.bind(40)),
}
messages = {what: error_of(attempt) for what, attempt in checks.items()}
for what, message in messages.items():
    print(f"{what}:\n    {message}")
assert "outside its range [1, 64]" in messages["n.bind(65)"]
assert "checked over the variables' ranges" in messages["x[:m], m <= 100"]
assert "'n' is 1000, outside its range [1, 64]" in messages["launch with n=1000"]
assert "pos in [0, 15] -> pos in [0, 99]" in messages["jit, a wider pos"]

# %% [markdown] id="sym-27"
# ## Summary
#
# - A `Variable` is a `DEFINE_VAR` with a name and a range; `.bind(v)` gives it a value for one
#   run; `unbind_graph` splits a graph into the graph over the variable and `var_vals`.
# - Sizes live in movement ops' args and loop bounds; the kernel takes `int n` after its
#   buffers, and its buffers are sized for n's largest value.
# - The simplifier uses `vmin`/`vmax`: a range is a promise, checked at `bind`, by `shrink`
#   (it must fit for every value) and at every launch.
# - One compiled kernel and one TinyJit capture serve every value — what makes the KV cache of
#   chapter 11b cheap.
#
# Next: chapter 5, the pattern matcher whose rules you saw fire above.
