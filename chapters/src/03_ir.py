# %% [markdown] id="ir-01"
# # Chapter 3 — The IR: UOps and the primitive op set
#
# Every stage of the compiler speaks one language. A Tensor is a graph of `UOp`s; a kernel
# handed to the code generator is a graph of `UOp`s; even the loops and loads of a lowered
# kernel are `UOp`s. Learning this one node type is learning to read the whole stack.
#
# **What you will learn**
# - a node is `UOp(op, dtype, src, arg)`: what it does, what it produces, its inputs, and an
#   op-specific argument;
# - the backend contract is 29 primitive ops (`PRIMITIVE_OPS`), each with reference semantics;
# - nodes are *hash-consed*: building the same node twice gives the same object, so equal
#   subgraphs are shared for free;
# - every node knows its shape, and integer nodes know their smallest and largest value;
# - how to print a graph (`pretty`) and draw it (`viz.graph`).
#
# **Where it lives:** [`tinyteach/ir/uop.py`](../tinyteach/ir/uop.py).

# %% id="ir-02"
import numpy as np

from tinyteach import Device, Tensor, dtypes

Device.DEFAULT = "CPU"      # the book's outputs must not depend on which devices exist here
Tensor.manual_seed(0)       # random tensors: the same numbers on every run
rng = np.random.default_rng(0)
# %load_ext tinyteach
import viz  # drawings: viz.graph, viz.schedule, viz.kernel, viz.rewrites

# %% id="ir-03"
from tinyteach.ir.uop import PRIMITIVE_OPS, Ops, UOp, pretty

# %% [markdown] id="ir-04"
# ## One node type
#
# A `UOp` is a frozen dataclass with four fields. Constants have no sources; an `ADD` has two.
# Python operators on UOps build nodes (a scalar is turned into a constant of the same dtype).

# %% id="ir-05"
three = UOp.const(dtypes.int32, 3)
expression = three * 4 + 1
print(expression.op, expression.dtype, expression.arg)
print([source.op.name for source in expression.src])
print(pretty(expression))

# %% [markdown] id="ir-06"
# `pretty` prints a graph one node per line, sources before users, numbering the nodes; a node
# used twice is printed once and referred to by number (`repr` of a UOp does the same).
#
# ## The primitive op set
#
# `Ops` has more members than the backend contract: `CONTIGUOUS`, `DETACH` and `ASSIGN` shape
# the graph for the Tensor layer; `SINK`, `STORE` and `DEFINE_GLOBAL` frame a kernel's AST as
# soon as the scheduler makes it (chapter 6: `SINK(STORE(DEFINE_GLOBAL 0, value))`); and
# `RANGE`, `LOAD`, `DEFINE_ACC`… appear only in lowered kernels (chapter 7), and `DEFINE_LOCAL`,
# `SPECIAL`, `BARRIER` only in GPU kernels (chapter 8b). What a backend must implement is
# `PRIMITIVE_OPS`:

# %% id="ir-07"
print(len(Ops), "ops in all;", len(PRIMITIVE_OPS), "primitive:")
print(", ".join(op.name for op in PRIMITIVE_OPS))
print("not primitive:", ", ".join(op.name for op in Ops if op not in PRIMITIVE_OPS))
assert len(PRIMITIVE_OPS) == 29

# %% [markdown] id="ir-08"
# (`DEFINE_VAR` and `BIND` in that list are symbolic sizes, a size that is a variable bound to a
# value per run: chapter 4b, [`04b_symbolic.ipynb`](04b_symbolic.ipynb).)
#
# Each primitive op has *reference semantics*: one numpy function in the `NUMPY` device,
# [`runtime/numpy.py`](../tinyteach/runtime/numpy.py). Integer ops follow C, not Python:
# `IDIV` truncates toward zero and `MOD` takes the sign of the dividend. Running the same tiny
# graph on the reference device and on compiled C gives the same answer:

# %% id="ir-09"
a = Tensor([7, -7, 7, -7], dtype=dtypes.int32)
d = Tensor([2, 2, -2, -2], dtype=dtypes.int32)
c_idiv = Tensor(a.uop.alu(Ops.IDIV, d.uop), "CPU").numpy()
c_mod = Tensor(a.uop.alu(Ops.MOD, d.uop), "CPU").numpy()
ref_idiv = Tensor(a.to("NUMPY").uop.alu(Ops.IDIV, d.to("NUMPY").uop), "NUMPY").numpy()
assert np.array_equal(c_idiv, ref_idiv)
assert np.array_equal(c_idiv, np.trunc(a.numpy() / d.numpy()).astype(np.int32))
assert np.array_equal(c_mod, np.fmod(a.numpy(), d.numpy()))
print("IDIV:", c_idiv, "  MOD:", c_mod, "  (Python's // would give", a.numpy() // d.numpy(), ")")

# %% [markdown] id="ir-10"
# ## Shapes are derived, not stored
#
# A node's shape follows from its sources and its arg (`SHAPE_RULES` in ir/uop.py): movement ops
# say their new shape in the arg, `REDUCE_AXIS` keeps reduced axes with size 1, elementwise ops
# take their sources' shape.

# %% id="ir-11"
x = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
node = x.uop
for step in [node.permute((1, 0)), node.reshape((6,)), node.expand((2, 3)).reduce(Ops.ADD, (1,)),
             node.pad(((1, 0), (0, 2))), node.shrink(((0, 1), (1, 3)))]:
    arg = (step.arg[0].name, step.arg[1]) if step.op is Ops.REDUCE_AXIS else step.arg
    print(f"{step.op.name:<12} arg={str(arg):<22} shape {step.shape}")

# %% [markdown] id="ir-12"
# ## Hash-consing: equal nodes are the same object
#
# `UOp(...)` first looks the node up in a table keyed by `(op, dtype, src, arg)`; if an
# identical node is alive it returns that one. So structural equality *is* identity, and
# building an expression twice does not build two graphs:

# %% id="ir-13"
assert (three * 4 + 1) is expression
x = Tensor([1.0, 2.0])
assert ((x + 1) * 2).uop is ((x + 1) * 2).uop
print("same object:", (three * 4 + 1) is expression)

# %% [markdown] id="ir-14"
# This gives common-subexpression elimination by construction. Below, `(x + 1)` is written
# three times but exists once in the graph: the `MUL` reads the same node twice, and the last
# `ADD` reads it again.

# %% id="ir-15"
y = (x + 1) * (x + 1) + (x + 1)
nodes = y.uop.toposort
adds = [n for n in nodes if n.op is Ops.ADD]
print(len(nodes), "nodes;", len(adds), "ADD nodes")
print(y.uop)
assert np.array_equal(y.numpy(), (x.numpy() + 1) ** 2 + x.numpy() + 1)

# %% [markdown] id="ir-16"
# A subtle detail: the table keeps `0.0` and `-0.0` apart (they compare equal in Python but
# `1/x` differs), and likewise `1` and `True`.

# %% id="ir-17"
print(UOp.const(dtypes.float32, 0.0) is UOp.const(dtypes.float32, -0.0))

# %% [markdown] id="ir-18"
# ## Value bounds
#
# Integer nodes know their smallest and largest value (`vmin`, `vmax`). A `RANGE` is a loop
# counter `0 ≤ r < n`; bounds propagate through `+`, `*`, `//`, `%`. The rewrite chapter uses
# them to prove that, for example, `(i*8 + j) // 8` is just `i` when `j < 8`.

# %% id="ir-19"
i = UOp(Ops.RANGE, dtypes.int32, (), ("g", 0, 4))   # 0 <= i < 4
j = UOp(Ops.RANGE, dtypes.int32, (), ("g", 1, 8))   # 0 <= j < 8
for e in [i, i * 8 + j, (i * 8 + j) // 8, (i * 8 + j) % 8, i * -3]:
    print(f"{str(e.op.name):>6}: {e.vmin} .. {e.vmax}")

# %% [markdown] id="ir-20"
# ## Drawing graphs
#
# `viz.graph` draws a Tensor's graph (or a UOp's). Each box shows op, shape and dtype; chains
# of movement ops are folded into one box (they cost nothing — chapter 4); colours are the
# kernels the scheduler will make (chapter 6). Nothing is computed to draw it.

# %% id="ir-21"
p = Tensor(rng.standard_normal((3, 4)).astype(np.float32))
q = Tensor(rng.standard_normal((3, 4)).astype(np.float32))
out = ((p + q) * 2).relu().sum(1)
viz.graph(out)

# %% [markdown] id="ir-22"
# The same view without folding shows every node, and `repr` prints the text form of the
# figure (what a terminal shows):

# %% id="ir-23"
figure = viz.graph(out, collapse_movement=False)
print(figure)

# %% [markdown] id="ir-24"
# ## Try it
#
# 1. How many nodes does the graph of `Tensor.ones(4, 4).softmax()` have, and which primitive
#    ops does it use?
# 2. Write a tiny interpreter `evaluate(node)` for scalar UOps made of `CONST`, `ADD`, `MUL`,
#    `NEG` and `MAX`, and check it on `(c * 4 + 1).maximum(-c)` for `c = 3`.
# 3. Build `x * 2 + x * 2` (x a Tensor). How many `MUL` nodes are in the graph? Why?

# %% [markdown] id="ir-25"
# #### Solution (click to show): exercise 1

# %% id="ir-26" jupyter={"source_hidden": true}
graph = Tensor.ones(4, 4).softmax().uop.toposort
print(len(graph), "nodes:", sorted({n.op.name for n in graph}))

# %% [markdown] id="ir-27"
# #### Solution (click to show): exercise 2

# %% id="ir-28" jupyter={"source_hidden": true}
SCALAR_OPS = {Ops.ADD: lambda a, b: a + b, Ops.MUL: lambda a, b: a * b,
              Ops.NEG: lambda a: -a, Ops.MAX: max}

def evaluate(node: UOp):
    if node.op is Ops.CONST:
        return node.arg
    return SCALAR_OPS[node.op](*(evaluate(s) for s in node.src))

c = UOp.const(dtypes.int32, 3)
assert evaluate((c * 4 + 1).maximum(-c)) == 13
evaluate((c * 4 + 1).maximum(-c))

# %% [markdown] id="ir-29"
# #### Solution (click to show): exercise 3

# %% id="ir-30" jupyter={"source_hidden": true}
x = Tensor([1.0, 2.0])
muls = [n for n in (x * 2 + x * 2).uop.toposort if n.op is Ops.MUL]
print(len(muls), "MUL node: both `x * 2` are the same hash-consed UOp")
