# %% [markdown] id="views-01"
# # Chapter 4 — Shapes without copies: views
#
# `reshape`, `permute`, `expand`, `pad`, `shrink` and `flip` never move data. Each one is a
# small *function from an index into its output to an index into its input*. Follow a chain of
# them down to a buffer and you get, for every output element, the address to read.
#
# **What you will learn**
# - the index function of each movement op (and, for `pad`, the condition saying whether the
#   element exists at all);
# - composing them with `index_into_buffer`, and checking the result element by element;
# - why the raw expressions look clumsy — and why that is fine, because chapter 5 simplifies
#   them.
#
# **Where it lives:** [`tinyteach/ir/view.py`](../tinyteach/ir/view.py). Its user is
# [`codegen/lower.py`](../tinyteach/codegen/lower.py), which turns these expressions into the loads of
# generated code (chapter 7).

# %% id="views-02"
import numpy as np

from tinyteach import Device, GlobalCounters, Tensor, dtypes

Device.DEFAULT = "CPU"      # the book's outputs must not depend on which devices exist here
Tensor.manual_seed(0)       # random tensors: the same numbers on every run
rng = np.random.default_rng(0)
# %load_ext tinyteach

# %% id="views-03"
from tinyteach.ir.uop import Ops, UOp
from tinyteach.ir.view import index_into_buffer, view_index
from viz.rewrites import expression  # prints an index UOp as a formula: ((gidx0*4)+gidx1)

# %% [markdown] id="views-04"
# ## Movement ops are views
#
# A realized tensor is a `BUFFER` node (a flat block of memory) plus, usually, a `RESHAPE`.
# Transposing it adds a `PERMUTE` node on top — the buffer is the very same object, and no
# kernel runs:

# %% id="views-05"
base_np = np.arange(12, dtype=np.float32).reshape(3, 4)
base = Tensor(base_np)
GlobalCounters.reset()
transposed = base.permute(1, 0)
print(transposed.uop)
print("kernels run:", GlobalCounters.kernel_count)
assert transposed.uop.src[0] is base.uop    # the PERMUTE reads the original node


# %% [markdown] id="views-06"
# ## An index is a tuple of integer UOps
#
# To talk about "element `(i, j)` of the output" we need symbols for `i` and `j`. Loop
# counters are `RANGE` nodes (`gidx0 < 4`, `gidx1 < 3`); an index is a tuple with one per
# output axis. `view_index(node, index)` maps it through one movement op:

# %% id="views-07"
def ranges(shape: tuple[int, ...]) -> tuple[UOp, ...]:
    return tuple(UOp(Ops.RANGE, dtypes.int32, (), ("g", axis, size))
                 for axis, size in enumerate(shape))

def show(node: UOp) -> None:
    index = ranges(node.shape)
    source_index, valid = view_index(node, index)
    out = ", ".join(expression(i) for i in index)
    into = ", ".join(expression(i) for i in source_index)
    condition = "" if valid is None else f"   if {expression(valid)}"
    print(f"{node.op.name:>8} {str(node.src[0].shape):>8} -> {str(node.shape):<8}"
          f" out[{out}] = in[{into}]{condition}")

square = base.uop   # shape (3, 4)
show(square.permute((1, 0)))
show(square.reshape((12,)))
show(square.reshape((2, 6)))
show(square.shrink(((1, 3), (0, 2))))
show(square.flip((1,)))
show(square.pad(((1, 1), (0, 0))))
show(square.reshape((3, 1, 4)).expand((3, 5, 4)))

# %% [markdown] id="views-08"
# Read each line as a rule:
#
# - **permute** swaps which counter goes where;
# - **reshape** flattens the output index to a position (`i*6 + j`) and unflattens it into the
#   input shape (`// 4`, `% 4`);
# - **shrink** adds the start offset; **flip** reads from the other end (`3 - j`);
# - **pad** shifts by the padding, and the element only exists where the shifted index is in
#   range — outside, the load is skipped and gives 0. (`!(i-1 < 0) & (i-1 < 3)` is `0 ≤ i-1 < 3`
#   written with the only comparison op we have, `<`);
# - **expand** reads element 0 of a broadcast axis, whatever the output index is.
#
# ## Composing views down to the buffer
#
# `index_into_buffer` applies these maps one after another, from the top of a chain of
# movement ops down to the `BUFFER`, and flattens the final index into a position in memory.

# %% id="views-09"
chain = base[:, ::-1].permute(1, 0)[1:3]      # flip, permute, shrink: still a view
buffer, position, valid = index_into_buffer(chain.uop, ranges(chain.shape))
print("shape", chain.shape, "reads", buffer.op.name, buffer.arg)
print("position:", expression(position))
print("valid:   ", valid)

# %% [markdown] id="views-10"
# To check the formula, evaluate it for every output index and read the numpy buffer at that
# position. A small evaluator substitutes numbers for the `RANGE`s, using the same Python
# reference semantics as constant folding (`PYTHON_ALU`, chapter 5):

# %% id="views-11"
import itertools

from tinyteach.ir.rewrite import PYTHON_ALU


def evaluate(node: UOp, env: dict[UOp, int]):
    if node.op is Ops.RANGE:
        return env[node]
    if node.op is Ops.CONST:
        return node.arg
    return PYTHON_ALU[node.op](*(evaluate(s, env) for s in node.src))

def gather_through_view(view: Tensor, flat: np.ndarray) -> np.ndarray:
    index = ranges(view.shape)
    buffer, position, valid = index_into_buffer(view.uop, index)
    out = np.zeros(view.shape, flat.dtype)
    for values in itertools.product(*(range(s) for s in view.shape)):
        env = dict(zip(index, values))
        if valid is None or evaluate(valid, env):
            out[values] = flat[evaluate(position, env)]
    return out

flat = base_np.reshape(-1)
assert np.array_equal(gather_through_view(chain, flat), base_np[:, ::-1].T[1:3])
gather_through_view(chain, flat)

# %% [markdown] id="views-12"
# The same check on a view with padding (the zeros come from the `valid` condition) and on
# one with a broadcast:

# %% id="views-13"
padded = base.pad(((1, 0), (0, 2))).flip(0)
assert np.array_equal(gather_through_view(padded, flat),
                      np.pad(base_np, ((1, 0), (0, 2)))[::-1])
stretched = base[1].reshape(1, 4).expand(3, 4).permute(1, 0)
assert np.array_equal(gather_through_view(stretched, flat),
                      np.broadcast_to(base_np[1], (3, 4)).T)
print("both views agree with numpy")

# %% [markdown] id="views-14"
# ## Why the raw expressions are clumsy
#
# Each map is simple, but composing them naively piles up arithmetic. Flattening to `(12,)`
# and unflattening back to `(3, 4)` changes nothing, yet:

# %% id="views-15"
round_trip = base.reshape(12).reshape(3, 4).permute(1, 0)
_, position, _ = index_into_buffer(round_trip.uop, ranges(round_trip.shape))
print(expression(position))
print(len(position.toposort), "nodes")

# %% [markdown] id="views-16"
# The position of element `(gidx0, gidx1)` of `round_trip` is simply `gidx1*4 + gidx0`, but
# the formula divides and takes remainders it does not need. (The maps already leave out
# what is plainly useless where they build it: no `+ 0`, `* 1` or `// 1`, and no `% n` of a
# single term known to lie below `n` — `view.index_add` and its siblings. A sum such as
# `gidx1*4 + gidx0` below 12 they leave to the rewriter.) Every generated load would pay for
# the rest.
# Knowing that `0 ≤ i < 4` and `0 ≤ j < 3` (the `vmin`/`vmax` of chapter 3), a rewrite pass can
# remove it — that is chapter 5's `symbolic`:

# %% id="views-17"
from tinyteach.ir.rewrite import graph_rewrite, symbolic

simplified = graph_rewrite(position, symbolic)
print(expression(simplified), "-", len(simplified.toposort), "nodes")
assert simplified is graph_rewrite(ranges((4, 3))[1] * 4 + ranges((4, 3))[0], symbolic)

# %% [markdown] id="views-18"
# Going through `(6, 2)` instead of `(12,)` is harder: the first reshape splits the index into
# a quotient and a remainder, and the second merges them back. The raw formula contains
# `(x//4)*4 + x%4`, which is just `x`; `symbolic` has a rule for exactly that (chapter 5), and
# the result is as tidy as before.

# %% id="views-19"
detour = base.reshape(6, 2).reshape(3, 4)
_, position, _ = index_into_buffer(detour.uop, ranges(detour.shape))
print(expression(graph_rewrite(position, symbolic)))

# %% [markdown] id="views-20"
# tinygrad used to keep views in a separate object, `ShapeTracker` (shape, strides, offset and
# mask per view, merged when possible). It removed `ShapeTracker` in 2025 and now does what
# tinyteach does: the movement ops stay in the graph, index arithmetic is derived from them, and
# the rewriter tidies it. Either way the result is one formula per load. (Older tinygrad code and
# write-ups still show `ShapeTracker`; it is the same idea, stored differently.)
#
# ## Try it
#
# 1. Write the index map of a 2-D transpose by hand (`(i, j) -> (j, i)`) and check it against
#    what `view_index` gives for `square.permute((1, 0))`.
# 2. For `t = base.reshape(4, 3).permute(1, 0)[::2]`, which position of the buffer does
#    element `t[1, 2]` read? Work it out, then check with `index_into_buffer`.
# 3. Is `base.pad(((2, 0), (0, 0))).shrink(((2, 5), (0, 4)))` the original tensor? Look at its
#    position and validity formulas before and after `symbolic`.

# %% [markdown] id="views-21"
# #### Solution (click to show): exercise 1

# %% id="views-22" jupyter={"source_hidden": true}
i, j = ranges((4, 3))
(source_i, source_j), valid = view_index(square.permute((1, 0)), (i, j))
assert (source_i, source_j) == (j, i) and valid is None
print(expression(source_i), expression(source_j))

# %% [markdown] id="views-23"
# #### Solution (click to show): exercise 2

# %% id="views-24" jupyter={"source_hidden": true}
t = base.reshape(4, 3).permute(1, 0)[::2]
index = ranges(t.shape)
_, position, valid = index_into_buffer(t.uop, index)
env = dict(zip(index, (1, 2)))
where = evaluate(position, env)
# t[1, 2] = reshaped[2, 2*1] -> row 2 of the (4, 3) reshape, column 2 -> 2*3 + 2 = 8
assert where == 8 and flat[where] == t.numpy()[1, 2]
where

# %% [markdown] id="views-25"
# #### Solution (click to show): exercise 3

# %% id="views-26" jupyter={"source_hidden": true}
back = base.pad(((2, 0), (0, 0))).shrink(((2, 5), (0, 4)))
index = ranges(back.shape)
_, position, valid = index_into_buffer(back.uop, index)
print("raw:       ", expression(position), " valid:", expression(valid))
print("simplified:", expression(graph_rewrite(position, symbolic)),
      " valid:", expression(graph_rewrite(valid, symbolic)))
assert np.array_equal(back.numpy(), base_np)
