# %% [markdown] id="autograd-01"
# # Chapter 2 — Autograd: reverse mode on the graph
#
# Training a network needs the gradient of a loss with respect to every weight. tinyteach
# computes it the way tinygrad and PyTorch do: **reverse-mode automatic differentiation**.
#
# **What you will learn**
# - each primitive op has one small gradient rule: given the gradient of its output, return
#   the gradients of its sources;
# - `backward()` walks the graph from the loss down, in reverse topological order, and sums
#   the gradients that reach a node from all of its users;
# - gradients are themselves lazy graphs made of the same primitive ops, so the scheduler fuses
#   them like any other work;
# - how to check gradients against finite differences, and how `no_grad` and `detach()` stop
#   them.
#
# **Where it lives:** [`tinyteach/tensor/gradient.py`](../tinyteach/tensor/gradient.py) (the rules and the
# walk) and `Tensor.backward` / `Tensor.gradient` in [`tensor/core.py`](../tinyteach/tensor/core.py).

# %% id="autograd-02"
import numpy as np

from tinyteach import Device, Tensor, dtypes

Device.DEFAULT = "CPU"      # the book's outputs must not depend on which devices exist here
Tensor.manual_seed(0)       # random tensors: the same numbers on every run
rng = np.random.default_rng(0)
# %load_ext tinyteach
import viz  # drawings: viz.graph, viz.schedule, viz.kernel, viz.rewrites

# %% [markdown] id="autograd-03"
# ## A first gradient
#
# Compute a scalar, call `backward()`, read `.grad`: in tinyteach, every float tensor the
# gradient reaches gets one unless it says `requires_grad=False` (`requires_grad=True`, as
# PyTorch needs it, is allowed but not needed; the rule, and how tinygrad's differs, is at the
# end of this chapter). For `y = Σ xᵢ²` the gradient is `2x`:

# %% id="autograd-04"
x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
y = (x * x).sum()
y.backward()
assert np.array_equal(x.grad.numpy(), 2 * x.numpy())
x.grad.numpy()

# %% [markdown] id="autograd-05"
# `x.grad` was a lazy tensor until `.numpy()` ran it. Its graph shows the chain rule at work:
# `MUL` sends `grad · other source` to each of its two sources, and because *both* sources are
# `x`, the two contributions are added — `ADD(%4, %4)` is `g·x + g·x`.

# %% id="autograd-06"
x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
(x * x).sum().backward()
print(x.grad.uop)

# %% [markdown] id="autograd-07"
# ## One rule per primitive op
#
# `GRADIENT_RULES` maps each op to a function `(grad, node) -> gradients of node.src`. There
# is one per primitive op that computes something, because only primitive ops need one:
# `softmax`, `conv2d` and cross-entropy get their gradients by composition. (One composite op
# also states its gradient as a whole, for speed, not for correctness: `conv2d` registers a rule
# (`register_gradient`) that gives its input the same numbers as a transposed convolution, one
# gather, where composition would store every window's gradient and then sum it.)

# %% id="autograd-08"
from tinyteach.ir.uop import PRIMITIVE_OPS, Ops, UOp
from tinyteach.tensor.gradient import GRADIENT_RULES

with_rule = [op.name for op in PRIMITIVE_OPS if op in GRADIENT_RULES]
print(len(with_rule), "primitive ops with a rule:", ", ".join(with_rule))
print("sources, no rule needed:", [op.name for op in PRIMITIVE_OPS if op not in GRADIENT_RULES])

# %% [markdown] id="autograd-09"
# A few rules, written as math (`g` is the gradient arriving at the node's output):
#
# | op | output | gradient to the sources |
# |---|---|---|
# | `ADD` | a + b | g, g |
# | `MUL` | a · b | g·b, g·a |
# | `EXP2` | 2ᵃ | g · 2ᵃ · ln 2 |
# | `RECIPROCAL` | 1/a | −g / a² |
# | `FDIV` | a / b | g / b, −g · (a / b) / b |
# | `MAX` | max(a, b) | to the larger source (half each on a tie) |
# | `WHERE` | c ? a : b | none to c; `c ? g : 0`, `c ? 0 : g` |
# | `EXPAND` | broadcast | sum g over the broadcast axes |
# | `REDUCE_AXIS` (sum) | Σ a | g expanded back to a's shape |
# | `PERMUTE`, `RESHAPE`, `PAD`, `SHRINK`, `FLIP` | a view | the inverse movement of g |
# | `CMPLT`, `CMPNE`, `IDIV`, `MOD`, bit ops | — | none: not differentiable |
#
# A rule can be called by hand on UOps. Here is `RECIPROCAL`'s, applied to `1/a` at `a = 4`
# with `g = 1`: the answer is `−1/16`.

# %% id="autograd-10"
from tinyteach.ir.rewrite import graph_rewrite, symbolic

a = UOp.const(dtypes.float32, 4.0)
node = a.alu(Ops.RECIPROCAL)
(gradient_of_a,) = GRADIENT_RULES[Ops.RECIPROCAL](UOp.const(dtypes.float32, 1.0), node)
print(gradient_of_a)
folded = graph_rewrite(gradient_of_a, symbolic)   # constant folding (chapter 5) evaluates it
print(folded)
assert folded.arg == -1 / 16


# %% [markdown] id="autograd-11"
# ## Backward is a graph walk
#
# `compute_gradient` visits the nodes from the root down (reverse topological order: every
# user of a node is visited before the node). At each node it applies the node's rule and adds
# the result into the gradients of the sources. Here is the same walk in a dozen lines, printing
# what it does on `y = Σ relu(x · w)`:

# %% id="autograd-12"
def walk_backward(root: UOp, verbose: bool = True) -> dict[UOp, UOp]:
    grads = {root: UOp.const(root.dtype, 1.0)}
    for node in reversed(root.toposort):
        if node not in grads or node.op in (Ops.BUFFER, Ops.CONST):
            continue
        source_grads = GRADIENT_RULES[node.op](grads[node], node)
        if verbose:
            print(f"{node.op.name:>12} {str(node.shape):>7} sends to",
                  [s.op.name for s, g in zip(node.src, source_grads) if g is not None])
        for source, grad in zip(node.src, source_grads):
            if grad is not None:
                grads[source] = grads[source] + grad if source in grads else grad
    return grads

x_np, w_np = np.array([1.0, -2.0, 3.0], np.float32), np.array([0.5, 0.5, -1.0], np.float32)
x, w = Tensor(x_np, requires_grad=True), Tensor(w_np, requires_grad=True)
y = (x * w).relu().sum()
grads = walk_backward(y.uop)

# %% [markdown] id="autograd-13"
# The gradient that reached `w`'s buffer is a graph; wrap it in a Tensor to run it. It must
# agree with `backward()` and with the math: `∂y/∂w = x · [x·w > 0]`.

# %% id="autograd-14"
mine = Tensor(grads[w.uop]).numpy()
y.backward()
assert np.array_equal(mine, w.grad.numpy())
assert np.array_equal(mine, x_np * (x_np * w_np > 0))
mine


# %% [markdown] id="autograd-15"
# The real `compute_gradient` adds two things: it only follows paths that lead to a tensor
# it was asked about (so no work is wasted on constants), and it moves gradients back
# across devices for `COPY`.
#
# ## Checking gradients against finite differences
#
# A gradient rule can be wrong in subtle ways, so every rule is tested against the definition
# of the derivative: `∂f/∂xᵢ ≈ (f(x + εeᵢ) − f(x − εeᵢ)) / 2ε`. Its error has two parts. The
# *truncation* error, about ε²·|f‴|/6, shrinks with ε. The *rounding* error grows as ε shrinks:
# each value of f is only known to about u·|f| (the unit roundoff u = 2⁻⁵³ ≈ 1.1·10⁻¹⁶ in
# float64, more after a few operations), and dividing a difference by 2ε magnifies that to
# about u·|f|/ε. The sum is smallest near ε ≈ u^⅓ ≈ 5·10⁻⁶, where both are about u^⅔ ≈ 10⁻¹¹.
# So ε = 10⁻⁶ below gives roughly 10⁻¹⁰, not ε² = 10⁻¹², and the check uses `rtol=1e-6`. In
# float32 (u ≈ 6·10⁻⁸) the best possible is about 10⁻⁵: gradient checks run in float64.

# %% id="autograd-16"
def f(t: Tensor) -> Tensor:
    return (t.tanh() * t.exp() + t.sin() / (1 + t * t)).sum()

def finite_differences(fn, values: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    result = np.zeros_like(values)
    for i in range(values.size):
        step = np.zeros_like(values)
        step.flat[i] = eps
        plus = fn(Tensor(values + step)).item()
        minus = fn(Tensor(values - step)).item()
        result.flat[i] = (plus - minus) / (2 * eps)
    return result

values = rng.standard_normal(5)                      # float64
t = Tensor(values, requires_grad=True)
f(t).backward()
numeric = finite_differences(f, values)
print("autograd:", t.grad.numpy().round(6))
print("numeric: ", numeric.round(6))
assert np.allclose(t.grad.numpy(), numeric, rtol=1e-6, atol=1e-8)


# %% [markdown] id="autograd-32"
# The trade-off, seen on `f(x) = x³` at `x = 1.1` (plain float64 arithmetic, so the same
# numbers on every machine): the error falls like ε² down to ε ≈ 10⁻⁵, then rises like 1/ε.

# %% id="autograd-33"
def cube(v: float) -> float:
    return v * v * v

exact = 3 * 1.1 * 1.1
errors = {}
for k in range(1, 13):
    eps = 1 / 10**k
    errors[k] = abs((cube(1.1 + eps) - cube(1.1 - eps)) / (2 * eps) - exact)
    print(f"eps = 1e-{k:02d}: error {errors[k]:.0e}")
best = min(errors, key=errors.get)
assert 4 <= best <= 6 and errors[12] > 1e3 * errors[best] and errors[1] > 1e3 * errors[best]

# %% [markdown] id="autograd-17"
# A larger check: softmax cross-entropy. Its gradient with respect to the logits is the
# famous `softmax(z) − one_hot(label)`, divided by the batch size for a mean — and autograd
# finds it by composing `EXP2`, `LOG2`, `REDUCE_AXIS`, `WHERE`… rules.

# %% id="autograd-18"
logits_np = rng.standard_normal((3, 5)).astype(np.float32)
labels = [4, 0, 2]
logits = Tensor(logits_np, requires_grad=True)
logits.sparse_categorical_crossentropy(Tensor(labels)).backward()
softmax = np.exp(logits_np) / np.exp(logits_np).sum(1, keepdims=True)
expected = (softmax - np.eye(5)[labels]) / 3
assert np.allclose(logits.grad.numpy(), expected, atol=1e-6)
logits.grad.numpy().round(3)

# %% [markdown] id="autograd-19"
# ## Gradients are lazy graphs too
#
# `backward()` only *builds* graph. When the gradient is realized, the scheduler fuses the
# forward and backward work into as few kernels as it can (chapter 6). `viz.graph` draws the
# gradient of `w` in the small example above, coloured by kernel:

# %% id="autograd-20"
x, w = Tensor(x_np, requires_grad=True), Tensor(w_np, requires_grad=True)
(x * w).relu().sum().backward()
viz.graph(w.grad)

# %% [markdown] id="autograd-21"
# ## Stopping gradients: `no_grad` and `detach()`
#
# `Tensor.no_grad` is tinygrad's switch, a plain `bool`: while it is `True`, nothing made
# records gradients (use it for evaluation and for optimizer updates). `Tensor.no_grad = True`
# turns it on until you set it back; `with Tensor.test():` (tinygrad's name; PyTorch's is
# `torch.no_grad()`) turns it on for one block and then restores it. `detach()` makes a
# tensor that has the same value but passes no gradient: here `x * x.detach()` has gradient
# `x`, not `2x`, because only one factor counts.
#
# A result made under `no_grad` prints `requires_grad: None`, the state that (below) means
# "gets a gradient if a backward reaches it". It does, itself; but it is cut from its sources
# (a `DETACH`), so a backward through it stops there and `x` gets none:

# %% id="autograd-22"
x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
with Tensor.test():
    frozen = x * 2
print("made under no_grad requires_grad:", frozen.requires_grad)
frozen.sum().backward()
print("after frozen.sum().backward(): frozen.grad", frozen.grad.tolist(), "x.grad", x.grad)
assert x.grad is None and frozen.grad.tolist() == [1.0, 1.0, 1.0]

(x * x.detach()).sum().backward()
assert np.array_equal(x.grad.numpy(), x.numpy())   # x, not 2x
x.grad.numpy()

# %% [markdown] id="autograd-23"
# When nothing on the graph can have a gradient (here every tensor is `requires_grad=False`),
# `backward()` says so rather than returning zeros:

# %% id="autograd-24"
try:
    (Tensor([1.0, 2.0], requires_grad=False) * 3).sum().backward()
except RuntimeError as error:
    print("RuntimeError:", error)

# %% [markdown] id="autograd-34"
# ## Who gets a gradient: three states of `requires_grad`
#
# This is tinyteach's rule: `requires_grad` is `True`, `None` or `False`. `None`, the default, means
# "gets a gradient if a backward reaches it": `backward()` adds to `.grad` of every live float
# tensor on its graph that is not a constant, intermediate results and the loss included.
# `True` does the same and marks a *leaf* (an optimizer turns `None` into `True`), `False` is
# a stop: never a `.grad` (BatchNorm's running statistics, the datasets). A result is `True` if
# a source is, `False` if every source is, else `None`. `Tensor.gradient(*targets)` differentiates
# with respect to any tensors, of any state, and returns the gradients without touching
# `.grad` (PyTorch's `torch.autograd.grad`); a target the gradient does not reach gets zeros.
#
# tinygrad's rule is not the same, and it changed. Until May 2026 tinygrad had the same three
# states, but `backward()` filled `.grad` only for `requires_grad=True` (an optimizer turned
# `None` into `True`). tinygrad 0.14, the version this book compares with, has no
# `requires_grad` at all: its `backward()` fills `.grad` of every float tensor on the graph, and
# `is_param` marks the parameters. tinyteach's `None` behaves like tinygrad 0.14; `False` is the
# stop that tinygrad 0.14 does not have.

# %% id="autograd-35"
w = Tensor([1.0, -2.0, 0.5], requires_grad=True)
data = Tensor([3.0, 1.0, 2.0])                     # None: the default
stats = Tensor([0.0, 0.0, 0.0], requires_grad=False)
print("results:", (w * data).requires_grad, (data * 2).requires_grad, (stats * 2).requires_grad)

loss = (w * data).sum()
dw, ddata, dstats = loss.gradient(w, data, stats)
assert np.array_equal(dw.numpy(), data.numpy()) and np.array_equal(ddata.numpy(), w.numpy())
assert np.array_equal(dstats.numpy(), np.zeros(3))
print("gradient() left .grad alone:", w.grad, data.grad)

loss.backward()
assert np.array_equal(w.grad.numpy(), data.numpy()) and np.array_equal(data.grad.numpy(), w.numpy())
assert stats.grad is None and loss.grad.item() == 1.0     # the loss itself gets ones
print("backward() filled w and data:", w.grad.tolist(), data.grad.tolist())

# %% [markdown] id="autograd-36"
# What autograd remembers between calls is one object, `AUTOGRAD` (an `AutogradState` in
# [`tensor/core.py`](../tinyteach/tensor/core.py)), whose docstring states how its maps and
# each tensor's own fields stay consistent: the live tensors `backward()` may fill, the lazy graph
# behind each realized tensor on a path to a leaf (so gradients still pass through a tensor
# realized half-way), and the losses that must be computed before an optimizer's step
# overwrites what they read. The gradient rules themselves are one table,
# `gradient.GRADIENT_RULES`: op → function of (gradient of the node, node). Each rule matches
# on the op alone, so a dict is the whole pattern matcher; tinygrad writes the same table as
# `pm_gradient`, a `PatternMatcher` of `UPat(op)` → rule.
#
# `contiguous_backward()` is the one tensor that is a no-op forward and a cut backward: its
# value is its input's, and the gradient that flows through it is computed into a buffer of
# its own (a `CONTIGUOUS` node in the backward graph only), which splits a long backward
# graph into kernels.

# %% id="autograd-37"
x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
loss = (x.contiguous_backward() * x).sum()
(dx,) = loss.gradient(x)
ops_forward = {node.op.name for node in loss.uop.toposort}
ops_backward = {node.op.name for node in dx.uop.toposort}
print("CONTIGUOUS in forward:", "CONTIGUOUS" in ops_forward,
      "in backward:", "CONTIGUOUS" in ops_backward)
assert np.array_equal(dx.numpy(), 2 * x.numpy())

# %% [markdown] id="autograd-25"
# ## Try it
#
# 1. Check that the gradient of `sigmoid` is `s · (1 − s)`, where `s = sigmoid(x)`.
# 2. `max` splits the gradient between ties. What is the gradient of `Tensor([1., 3., 3.]).max()`?
#    Predict it, then check.
# 3. Gradients are graphs, so you can differentiate them again. Compute the second derivative
#    of `Σ x³` with `Tensor.gradient` (hint: do not realize the first gradient in between) and
#    check it equals `6x`.

# %% [markdown] id="autograd-26"
# #### Solution (click to show): exercise 1

# %% id="autograd-27" jupyter={"source_hidden": true}
values = np.linspace(-4, 4, 9, dtype=np.float32)
x = Tensor(values, requires_grad=True)
x.sigmoid().sum().backward()
s = 1 / (1 + np.exp(-values))
assert np.allclose(x.grad.numpy(), s * (1 - s), atol=1e-6)

# %% [markdown] id="autograd-28"
# #### Solution (click to show): exercise 2

# %% id="autograd-29" jupyter={"source_hidden": true}
t = Tensor([1.0, 3.0, 3.0], requires_grad=True)
t.max().backward()
assert t.grad.tolist() == [0.0, 0.5, 0.5]
t.grad.tolist()

# %% [markdown] id="autograd-30"
# #### Solution (click to show): exercise 3

# %% id="autograd-31" jupyter={"source_hidden": true}
x = Tensor([1.0, 2.0, -3.0], dtype=dtypes.float64, requires_grad=True)
(first,) = (x * x * x).sum().gradient(x)      # 3x², still lazy
(second,) = first.sum().gradient(x)           # d/dx Σ 3x² = 6x
assert np.allclose(first.numpy(), 3 * x.numpy() ** 2)
assert np.allclose(second.numpy(), 6 * x.numpy())
second.numpy()
