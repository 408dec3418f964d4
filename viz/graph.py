"""`viz.graph(tensor)`: the lazy graph of a Tensor, coloured by the kernel each node will land in.

What a student sees:
- one box per node: its op, shape and dtype. Inputs (realized buffers) are cylinders, constants
  have a dashed border, stored results (the outputs, and anything the scheduler decided to keep
  in memory) have a double border;
- the fill colour is the kernel the node will be computed in, and nodes of one kernel sit in one
  labelled cluster. A node computed in two kernels is striped in both colours: the scheduler
  recomputes cheap elementwise work instead of storing it;
- chains of movement ops (RESHAPE -> EXPAND, ...) are folded into the node they start from, since
  they cost nothing (chapter 4); graphs above `max_nodes` boxes are drawn one box per kernel;
- graphs too big or too deep to plan as a whole (a 100,000-op chain) are cut: the `max_nodes`
  nodes nearest the result are drawn, the values the rest pass in are dashed "left out" inputs,
  and a note says how many nodes were left out.

Nothing is computed: the schedule is planned on the graph (viz/plan.py), the tensor stays lazy.
Every walk over the graph is a loop over `UOp.toposort`: no recursion on the graph's depth.

Builds on: viz/plan.py, viz/figure.py. Used by: viz/magic.py, the chapters.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tinyteach.device import Buffer
from tinyteach.helpers import prod
from tinyteach.ir.uop import MOVEMENT, Ops, UOp, is_bitcast
from viz.figure import (
    DotWriter,
    Figure,
    escape,
    graph_figure,
    kernel_color,
    notice,
    swatch,
    table,
)
from viz.plan import (
    MAX_PLANNED_DEPTH,
    Plan,
    as_uops,
    device_of,
    graph_depth,
    graph_nodes,
    is_plannable,
    make_plan,
)

DEFAULT_MAX_NODES = 80


@dataclass
class Box:
    """One drawn node: a UOp, plus the movement ops folded onto it (`nodes[-1]` is what users
    of the box read)."""

    number: int
    nodes: list[UOp]

    @property
    def name(self) -> str:
        return f"n{self.number}"

    @property
    def head(self) -> UOp:
        return self.nodes[-1]

    @property
    def start(self) -> UOp:
        return self.nodes[0]


def graph(*tensors: Any, device: str | None = None, max_nodes: int | None = DEFAULT_MAX_NODES,
          collapse_movement: bool = True, group: bool = True) -> Figure:
    """Draw the lazy graph of one or more Tensors (or UOps) as SVG; nothing is computed.
    Graphs of more than `max_nodes` boxes are drawn one box per kernel, or cut if they are too
    big to plan whole (`viz.plan.is_plannable`); `max_nodes=None` plans and draws every node."""
    if max_nodes is not None and max_nodes < 1:
        raise ValueError(f"max_nodes must be at least 1 (or None for no limit), got {max_nodes}")
    nodes = graph_nodes(as_uops(tensors))
    if max_nodes is not None and not is_plannable(nodes):
        return _cut_graph(tensors, nodes, device, max_nodes, collapse_movement, group)
    plan = make_plan(tensors, device)
    boxes = make_boxes(plan, collapse_movement)
    if max_nodes is not None and len(boxes) > max_nodes:
        return _too_big(tensors, device, len(boxes), max_nodes)
    title = f"lazy graph: {len(boxes)} nodes, {len(plan.items)} kernel(s)"
    dot = _graph_dot(plan, boxes, group)
    return graph_figure(title, dot, text_view(plan, boxes), legend(plan))


def _too_big(tensors: tuple[Any, ...], device: str | None, count: int, limit: int) -> Figure:
    from viz.schedule import schedule  # one box per kernel is exactly the schedule view

    figure = schedule(*tensors, device=device)
    message = (f"This graph has {count} nodes (more than max_nodes={limit}), so it is drawn "
               f"one box per kernel. graph(..., max_nodes=None) draws every node.")
    figure.html = notice(message) + figure.html
    figure.text = message + "\n" + figure.text
    return figure


# ---- a cut graph: the nodes nearest the result ----

def left_out_input(node: UOp, device: str) -> tuple[UOp, UOp]:
    """A BUFFER standing in for `node` (never allocated), and its view in `node`'s shape."""
    buffer = UOp(Ops.BUFFER, node.dtype, (), Buffer(device, prod(node.shape), node.dtype))
    return buffer, buffer.reshape(node.shape)


def cut(roots: list[UOp], nodes: list[UOp], keep: int, device: str
        ) -> tuple[list[UOp], set[UOp], int]:
    """The last `keep` nodes (and the roots); every other node they read that computes
    something becomes a left-out input. Returns the new roots, the stand-in BUFFERs and how
    many nodes were left out."""
    kept = dict.fromkeys([*nodes[-keep:], *roots])
    replacements: dict[UOp, UOp] = {}
    stand_ins: set[UOp] = set()
    leaves: dict[UOp, None] = {}
    for node in kept:
        for source in node.src:
            if source in kept or source in replacements or source in leaves:
                continue
            chain = view_of_leaf(source)
            if chain:  # a realized buffer or a constant, maybe reshaped: drawn as it is
                leaves.update(dict.fromkeys(chain))
                continue
            buffer, view = left_out_input(source, device)
            stand_ins.add(buffer)
            replacements[source] = view
    new_roots = [root.substitute(replacements) for root in roots]
    return new_roots, stand_ins, len(nodes) - len(kept) - len(leaves)


def view_of_leaf(node: UOp) -> list[UOp]:
    """`node` and the movement ops under it, if they end at a node with no sources (a BUFFER
    or a CONST); otherwise []."""
    chain = [node]
    while chain[-1].op in MOVEMENT:
        chain.append(chain[-1].src[0])
    return chain if not chain[-1].src else []


def _cut_graph(tensors: tuple[Any, ...], nodes: list[UOp], device: str | None, max_nodes: int,
               collapse_movement: bool, group: bool) -> Figure:
    target_device = device_of(tensors, device)
    keep = min(max_nodes, MAX_PLANNED_DEPTH)  # the drawn part is planned: it must be plannable
    roots, stand_ins, left_out = cut(as_uops(tensors), nodes, keep, target_device)
    plan = make_plan(tuple(roots), target_device, left_out=stand_ins)
    boxes = make_boxes(plan, collapse_movement)
    message = (f"This graph has {len(nodes)} nodes and is {graph_depth(nodes)} deep, too big to "
               f"plan and draw whole (max_nodes={max_nodes}): drawn are the {keep} nodes "
               f"nearest the result; the {left_out} before them are left out, and the values "
               "they pass in are dashed 'left out' inputs. The kernels shown are planned for "
               "the drawn part alone.")
    title = (f"lazy graph, cut: {len(boxes)} boxes for the last part of {len(nodes)} nodes, "
             f"{len(plan.items)} kernel(s)")
    figure = graph_figure(title, _graph_dot(plan, boxes, group), text_view(plan, boxes),
                          legend(plan))
    figure.html = notice(message) + figure.html
    figure.text = message + "\n" + figure.text
    return figure


# ---- boxes: nodes, with movement chains folded in ----

def _users(nodes: list[UOp]) -> dict[UOp, list[UOp]]:
    users: dict[UOp, list[UOp]] = {node: [] for node in nodes}
    for node in nodes:
        for source in dict.fromkeys(node.src):
            users[source].append(node)
    return users


def make_boxes(plan: Plan, collapse_movement: bool = True) -> list[Box]:
    """Nodes in graph order; a movement op whose source has no other user joins its source."""
    nodes = plan.nodes()
    users = _users(nodes)
    boxes: list[Box] = []
    box_of: dict[UOp, Box] = {}
    for node in nodes:
        source = node.src[0] if node.src else None
        foldable = (collapse_movement and node.op in MOVEMENT and source is not None
                    and len(users[source]) == 1 and source not in plan.realized)
        if foldable and source is not None:
            box = box_of[source]
            box.nodes.append(node)
        else:
            box = Box(len(boxes), [node])
            boxes.append(box)
        box_of[node] = box
    return boxes


# ---- what a box says ----

def describe_op(node: UOp) -> str:
    """The op with the part of its arg a student needs: `CONST 1.0`, `REDUCE_AXIS sum (1,)`."""
    if node.op is Ops.CONST:
        return f"CONST {node.arg}"
    if node.op is Ops.REDUCE_AXIS:
        kind = "sum" if node.arg[0] is Ops.ADD else "max"
        return f"REDUCE_AXIS {kind} axes {node.arg[1]}"
    if node.op is Ops.COPY:
        return f"COPY to {node.arg}"
    if node.op is Ops.CAST:  # (a bitcast keeps the bits: it is no conversion, and says so)
        return f"{'BITCAST' if is_bitcast(node) else 'CAST'} to {node.dtype.name}"
    return node.op.name


def box_ops(box: Box) -> str:
    return " → ".join(describe_op(n) if i == 0 else n.op.name for i, n in enumerate(box.nodes))


def box_role(box: Box, plan: Plan) -> str:
    head = box.head
    if box.start in plan.left_out:
        return "left out: computed by nodes not drawn"
    if box.start.op is Ops.BUFFER:
        return "input: a realized buffer"
    if head in plan.realized:
        stored = "output, stored" if head in plan.roots else "stored"
        return f"{stored} by kernel {plan.item_of[head] + 1}"
    kernels = plan.kernels_of.get(head, [])
    if len(kernels) > 1:
        return "recomputed in kernels " + ", ".join(str(k + 1) for k in kernels)
    return ""


def box_label(box: Box, plan: Plan) -> str:
    head = box.head
    lines = [box_ops(box), f"{head.shape} {head.dtype.name}", box_role(box, plan)]
    return "\n".join(line for line in lines if line)


def box_style(box: Box, plan: Plan) -> dict[str, str | int | float]:
    """Shape and colour: inputs, constants, stored results and shared nodes look different."""
    head = box.head
    kernels = plan.kernels_of.get(head, [])
    if box.start in plan.left_out:
        return {"shape": "cylinder", "style": "filled,dashed", "fillcolor": "#eeeeee"}
    if box.start.op is Ops.BUFFER:
        return {"shape": "cylinder", "style": "filled", "fillcolor": "white"}
    fill = kernel_color(kernels[0]) if kernels else "white"
    attrs: dict[str, str | int | float] = {"shape": "box", "style": "rounded,filled",
                                           "fillcolor": fill}
    if len(kernels) > 1:
        colors = ":".join(kernel_color(k) for k in kernels)
        attrs.update(style="striped", fillcolor=colors)
    if box.start.op is Ops.CONST:
        attrs["style"] = str(attrs["style"]) + ",dashed"
    if head in plan.realized:
        attrs.update(peripheries=2, penwidth=1.5)
    return attrs


# ---- the DOT text ----

def _graph_dot(plan: Plan, boxes: list[Box], group: bool) -> str:
    dot = DotWriter("graph", rankdir="TB", nodesep="0.25", ranksep="0.35")
    by_kernel: dict[int, list[Box]] = {}
    loose: list[Box] = []
    for box in boxes:
        kernels = plan.kernels_of.get(box.head, [])
        if group and len(kernels) == 1 and box.start.op is not Ops.BUFFER:
            by_kernel.setdefault(kernels[0], []).append(box)
        else:
            loose.append(box)
    for number in sorted(by_kernel):
        item = plan.items[number]
        dot.open_cluster(f"kernel{number}", f"kernel {number + 1}: {item.name}",
                         style="rounded", color="#999999", fontname="Helvetica", fontsize=10)
        for box in by_kernel[number]:
            dot.node(box.name, box_label(box, plan), **box_style(box, plan))
        dot.close_cluster()
    for box in loose:
        dot.node(box.name, box_label(box, plan), **box_style(box, plan))
    _edges(dot, plan, boxes)
    return dot.source()


def _edges(dot: DotWriter, plan: Plan, boxes: list[Box]) -> None:
    box_of = {node: box for box in boxes for node in box.nodes}
    for box in boxes:
        for source in dict.fromkeys(box.start.src):
            from_memory = source in plan.realized or box_of[source].start.op is Ops.BUFFER
            if from_memory:
                dot.edge(box_of[source].name, box.name, penwidth=2, color="#555555")
            else:
                dot.edge(box_of[source].name, box.name)


# ---- the legend and the text view ----

def legend(plan: Plan) -> str:
    rows = [[swatch(kernel_color(number)), f"kernel {number + 1}", escape(item.name),
             escape(f"stored because {item.boundary_reason}")]
            for number, item in enumerate(plan.items)]
    key = ("cylinder: an input buffer · dashed: a constant · double border: stored in memory · "
           "striped: recomputed in several kernels · bold edge: read from memory")
    if plan.left_out:
        key += " · grey dashed cylinder: the value of nodes left out of the drawing"
    kernels = table(rows, ["", "kernel", "name", "why its result is stored"]) if rows else ""
    return kernels + f'<div style="font-size:11px;color:#555;margin-top:4px">{key}</div>'


def text_view(plan: Plan, boxes: list[Box]) -> str:
    """The graph as lines of text: what the SVG shows, for terminals and when `dot` is missing."""
    box_of = {node: box for box in boxes for node in box.nodes}
    lines = [f"lazy graph: {len(boxes)} nodes, {len(plan.items)} kernel(s)"]
    for number, item in enumerate(plan.items):
        lines.append(f"  kernel {number + 1}: {item.name} (stored because "
                     f"{item.boundary_reason})")
    for box in boxes:
        sources = ", ".join(box_of[s].name for s in dict.fromkeys(box.start.src))
        role = box_role(box, plan)
        kernels = plan.kernels_of.get(box.head, [])
        is_input = box.start.op is Ops.BUFFER
        where = f"  [kernel {kernels[0] + 1}]" if len(kernels) == 1 and not is_input else ""
        arrow = f"  <- {sources}" if sources else ""
        extra = f"  ({role})" if role else ""
        lines.append(f"{box.name}: {box_ops(box)} {box.head.shape} {box.head.dtype.name}"
                     f"{where}{extra}{arrow}")
    return "\n".join(lines)
