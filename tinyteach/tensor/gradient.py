"""Chapter 2: autograd — reverse mode on the lazy graph.

What this teaches:
- each primitive op has one gradient rule: given the gradient of its output, return the
  gradient of each source. There are only ~20 rules, in one table (`GRADIENT_RULES`, op ->
  rule), because everything else — softmax, conv2d, cross-entropy — is made of these ops, and
  the chain rule composes them;
- backpropagation walks the graph from the loss down, in reverse topological order, summing
  the gradients that reach each node from its users;
- gradients are themselves lazy UOp graphs: `backward()` builds more graph, and the scheduler
  fuses forward and backward work when the result is realized;
- a composite op may state its gradient as a whole (`register_gradient`): the rules would give
  the same numbers, but a cheaper graph exists. conv2d's input gradient is a transposed
  convolution (one gather) where the rules scatter through the window view.

Builds on: ir/uop.py. Used by: tensor/core.py (`backward`, `Tensor.gradient`).

>>> from tinyteach import Tensor
>>> x = Tensor([2.0, 3.0], requires_grad=True)
>>> _ = (x * x).sum().backward()
>>> x.grad.tolist()
[4.0, 6.0]
"""
from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Mapping

from tinyteach.dtype import dtypes
from tinyteach.helpers import argsort
from tinyteach.ir.uop import Ops, UOp, is_bitcast

Grads = tuple[UOp | None, ...]


def _reduce_grad(grad: UOp, node: UOp) -> Grads:
    # a sum copies the gradient to every element it summed; a max gives it to the maxima
    if node.arg[0] is Ops.MAX:
        return _reduce_max_grad(grad, node)
    return (grad.expand(node.src[0].shape),)


def _reduce_max_grad(grad: UOp, node: UOp) -> Grads:
    # the gradient goes to the elements equal to the max, split evenly between ties; a NaN
    # max equals nothing, so then it is shared by the NaN elements (x != x), as in PyTorch
    source = node.src[0]
    equal = source.ne(node.expand(source.shape)).ne(True)
    is_max = (equal | source.ne(source)).cast(source.dtype)
    ties = is_max.reduce(Ops.ADD, node.arg[1]).expand(source.shape)
    return (is_max * ties.alu(Ops.RECIPROCAL) * grad.expand(source.shape),)


def _max_grad(grad: UOp, node: UOp) -> Grads:
    # max(a, b): all to the larger, half each when equal (as PyTorch's maximum)
    a, b = node.src
    a_wins = b.lt(a).cast(grad.dtype)
    equal = a.ne(b).ne(True).cast(grad.dtype) * 0.5
    share_a = a_wins + equal
    return (grad * share_a, grad * (share_a.const_like(1.0) - share_a))


def _sin_grad(grad: UOp, node: UOp) -> Grads:
    x = node.src[0]
    return (grad * (x.const_like(math.pi / 2) - x).alu(Ops.SIN),)  # d sin x = cos x


def _fdiv_grad(grad: UOp, node: UOp) -> Grads:
    # d(x/y)/dx = 1/y and d(x/y)/dy = -x/y^2, written as PyTorch's autograd writes them
    # (grad / y and -grad * ((x / y) / y)), so that special values come out as there: y = 0
    # gives +-inf or NaN, and x/y/y does not overflow where x/(y*y) would
    divisor = node.src[1]
    return (grad.alu(Ops.FDIV, divisor), -grad * node.alu(Ops.FDIV, divisor))


def _where_grad(grad: UOp, node: UOp) -> Grads:
    # the condition gets none; each branch gets the gradient where it was chosen
    condition = node.src[0]
    return (None, condition.where(grad, 0.0), condition.where(0.0, grad))


def _expand_grad(grad: UOp, node: UOp) -> Grads:
    # broadcasting copies a value, so the gradient sums over the broadcast axes
    source_shape = node.src[0].shape
    axes = tuple(i for i, (s, n) in enumerate(zip(source_shape, node.shape)) if s == 1 and n != 1)
    if grad.dtype in _SUMMED_IN_FLOAT32:  # as Tensor.sum: half floats add up in float32
        return (grad.cast(dtypes.float32).reduce(Ops.ADD, axes).cast(grad.dtype),)
    return (grad.reduce(Ops.ADD, axes),)


_SUMMED_IN_FLOAT32 = (dtypes.float16, dtypes.bfloat16)


def _pad_grad(grad: UOp, node: UOp) -> Grads:
    return (grad.shrink(tuple((b, b + s) for (b, _), s in zip(node.arg, node.src[0].shape))),)


def _shrink_grad(grad: UOp, node: UOp) -> Grads:
    sizes = node.src[0].shape
    return (grad.pad(tuple((start, size - end) for (start, end), size in zip(node.arg, sizes))),)


def _detach_grad(grad: UOp, node: UOp) -> Grads:
    # detach() stops the gradient; contiguous_backward() lets it through, into a buffer
    if node.arg == CONTIGUOUS_BACKWARD:
        return (UOp(Ops.CONTIGUOUS, grad.dtype, (grad,)),)
    return (None,)


def _no_grad(grad: UOp, node: UOp) -> Grads:
    return (None,) * len(node.src)


def _cast_grad(grad: UOp, node: UOp) -> Grads:
    """A conversion passes the gradient back in the source's dtype; a bitcast passes none
    (its bits are no differentiable function of the value; Tensor.bitcast detaches anyway)."""
    if is_bitcast(node):
        return (None,)
    return (grad.cast(node.src[0].dtype),)


# the arg of a DETACH that Tensor.contiguous_backward() made (tinygrad has an op of its own)
CONTIGUOUS_BACKWARD = "contiguous_backward"

# op -> rule(gradient of the node, node) -> the gradient of each source (None: no gradient).
# Every rule matches on the op alone, so a dict is the whole pattern matcher (tinygrad writes
# the same table as `pm_gradient`, a PatternMatcher of UPat(op) -> rule).
GRADIENT_RULES: dict[Ops, Callable[[UOp, UOp], Grads]] = {
    Ops.ADD: lambda grad, node: (grad, grad),
    Ops.MUL: lambda grad, node: (grad * node.src[1], grad * node.src[0]),
    Ops.FDIV: _fdiv_grad,
    Ops.NEG: lambda grad, node: (-grad,),
    Ops.EXP2: lambda grad, node: (grad * node * math.log(2),),         # d 2^x = 2^x ln 2
    Ops.LOG2: lambda grad, node: (grad * (node.src[0] * math.log(2)).alu(Ops.RECIPROCAL),),
    Ops.SIN: _sin_grad,
    Ops.SQRT: lambda grad, node: (grad * (node * 2).alu(Ops.RECIPROCAL),),
    Ops.RECIPROCAL: lambda grad, node: (-grad * node * node,),         # d 1/x = -1/x^2
    Ops.CAST: _cast_grad,
    Ops.MAX: _max_grad,
    Ops.WHERE: _where_grad,
    Ops.REDUCE_AXIS: _reduce_grad,
    Ops.RESHAPE: lambda grad, node: (grad.reshape(node.src[0].shape),),
    Ops.PERMUTE: lambda grad, node: (grad.permute(tuple(argsort(list(node.arg)))),),
    Ops.EXPAND: _expand_grad,
    Ops.PAD: _pad_grad,
    Ops.SHRINK: _shrink_grad,
    Ops.FLIP: lambda grad, node: (grad.flip(node.arg),),
    Ops.CONTIGUOUS: lambda grad, node: (grad,),
    Ops.COPY: lambda grad, node: (None,),  # replaced in compute_gradient: it needs the device
    Ops.DETACH: _detach_grad,
    Ops.ASSIGN: _no_grad,
    Ops.CMPLT: _no_grad, Ops.CMPNE: _no_grad, Ops.IDIV: _no_grad, Ops.MOD: _no_grad,
    Ops.AND: _no_grad, Ops.OR: _no_grad, Ops.XOR: _no_grad,
}


# ---- composite ops that state their own gradient ----
#
# A few composite ops are cheaper to differentiate as a whole than op by op. conv2d is the one:
# the primitive rules send its input's gradient back through the window view, which scatters
# (every window's gradient is stored, then summed into the pixels: two kernels and a buffer of
# N x C x out x k floats), while the same gradient is a transposed convolution, a gather (one
# kernel). Such an op registers its result node with its inputs and a rule (PyTorch calls this
# an autograd.Function): the walk below then sends the gradient straight to the inputs, and the
# nodes inside the op get none from this use.

Rule = Callable[..., Grads]  # rule(gradient of the result, *inputs) -> one gradient per input
_custom_gradients: weakref.WeakKeyDictionary[UOp, tuple[tuple[UOp, ...], Rule]] = \
    weakref.WeakKeyDictionary()


def register_gradient(result: UOp, inputs: tuple[UOp, ...], rule: Rule) -> None:
    """Differentiate `result` as a whole: its gradient goes to `inputs` by `rule`, not
    through the ops that compute it (which must give the same gradient: the rule is a faster
    way to the same numbers). Kept while `result` lives."""
    _custom_gradients[result] = (inputs, rule)


def _sources_and_grads(node: UOp, grad: UOp) -> tuple[tuple[UOp, ...], Grads]:
    custom = _custom_gradients.get(node)
    if custom is not None:
        inputs, rule = custom
        return inputs, rule(grad, *inputs)
    return node.src, GRADIENT_RULES[node.op](grad, node)


def stops_gradient(node: UOp) -> bool:
    """Does no gradient pass through `node` to its sources? (detach(), comparisons, integer
    ops, bitcasts; not a contiguous_backward(), a DETACH that lets the gradient through)."""
    if node.op is Ops.DETACH:
        return node.arg != CONTIGUOUS_BACKWARD
    return GRADIENT_RULES.get(node.op) is _no_grad or is_bitcast(node)


def graph_before_realize(root: UOp, graph_behind: Mapping[UOp, UOp]) -> UOp:
    """`root` with each realized buffer in `graph_behind` replaced by the lazy graph that
    computed it: a tensor that was realized half-way still passes gradients back.
    (That graph may hold realized buffers in turn: a loop realized 5,000 times nests 5,000
    deep, so the walk keeps its own stack, and treats a buffer's graph as its one source.)"""
    if not graph_behind:
        return root

    def inputs(node: UOp) -> tuple[UOp, ...]:
        return (graph_behind[node],) if node in graph_behind else node.src

    rebuilt: dict[UOp, UOp] = {}
    stack: list[tuple[UOp, bool]] = [(root, False)]
    while stack:
        node, inputs_done = stack.pop()
        if node in rebuilt:
            continue
        if not inputs_done:
            stack.append((node, True))
            stack.extend((s, False) for s in reversed(inputs(node)) if s not in rebuilt)
        elif node in graph_behind:
            rebuilt[node] = rebuilt[graph_behind[node]]
        else:
            sources = tuple(rebuilt[s] for s in node.src)
            rebuilt[node] = node if sources == node.src else node.replace(src=sources)
            _carry_custom_gradient(node, rebuilt[node], rebuilt)
    return rebuilt[root]


def _carry_custom_gradient(node: UOp, new: UOp, rebuilt: Mapping[UOp, UOp]) -> None:
    """A composite op rebuilt on the graphs behind its realized inputs keeps its own rule."""
    custom = _custom_gradients.get(node) if new is not node else None
    if custom is not None and all(i in rebuilt for i in custom[0]):
        register_gradient(new, tuple(rebuilt[i] for i in custom[0]), custom[1])


def reachable_by_gradient(root: UOp) -> set[UOp]:
    """The nodes a gradient from `root` can reach: it stops at DETACH, comparisons and the
    other ops without a gradient (their sources get none)."""
    reached = {root}
    for node in reversed(root.toposort):
        if node in reached and not stops_gradient(node):
            reached.update(node.src)
    return reached


def _on_path(root: UOp, targets: set[UOp]) -> set[UOp]:
    """The nodes through which `root` depends on a target: only they need gradients."""
    needed: set[UOp] = set()
    for node in root.toposort:
        passes_gradient = not stops_gradient(node) and any(s in needed for s in node.src)
        if node in targets or passes_gradient:
            needed.add(node)
    return needed


def compute_gradient(root: UOp, root_grad: UOp, targets: set[UOp],
                     copy_back: Callable[[UOp, UOp], UOp]) -> dict[UOp, UOp]:
    """Gradients of `root` with respect to every node on a path to `targets`.
    `copy_back(grad, source)` moves a gradient to the device of `source` (for COPY)."""
    needed = _on_path(root, targets)
    grads: dict[UOp, UOp] = {root: root_grad}
    for node in reversed(root.toposort):
        if node not in grads or node.op in (Ops.BUFFER, Ops.CONST):
            continue
        if node.op is Ops.COPY:
            source_grads: Grads = (copy_back(grads[node], node.src[0]),)
            sources = node.src
        elif node.op in GRADIENT_RULES or node in _custom_gradients:
            sources, source_grads = _sources_and_grads(node, grads[node])
        else:
            raise NotImplementedError(f"no gradient rule for {node.op.name}")
        for source, grad in zip(sources, source_grads):
            if grad is None or source not in needed:
                continue
            grads[source] = grads[source] + grad if source in grads else grad
    return grads
