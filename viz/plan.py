"""Which kernel each node of a lazy graph will land in — computed without running anything.

What this teaches:
- the scheduler (chapter 6) is a pure function of the graph: `find_realized` says which nodes get
  their own buffer and why, `create_schedule` turns each of them into a kernel. viz plans with
  `realize.build_schedule`, the very function realize() runs (packing copies included), so it
  draws the kernels that would run. Calling it on a tensor's graph computes nothing and changes
  nothing (UOps are immutable; the Buffers it makes are not allocated until a kernel runs), so
  viz can ask "what would happen?" at no cost;
- a node belongs to every kernel that reads it without going through a stored buffer. Elementwise
  nodes used by two kernels are in both: the scheduler recomputes them rather than store them.

Builds on: tinyteach.engine.realize, tinyteach.engine.schedule. Used by: every view.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tinyteach.device import Device
from tinyteach.engine.realize import build_schedule
from tinyteach.engine.schedule import ScheduleItem
from tinyteach.ir.uop import Ops, UOp, unbind_graph


@dataclass
class Plan:
    """The schedule of some roots, and for each node the kernels (item numbers: positions in
    `items`, the order they run in) it lands in."""

    roots: list[UOp]
    items: list[ScheduleItem]
    realized: dict[UOp, str]
    item_of: dict[UOp, int]                        # realized node -> the item that stores it
    kernels_of: dict[UOp, list[int]] = field(default_factory=dict)
    left_out: set[UOp] = field(default_factory=set)  # BUFFERs standing in for undrawn nodes

    def nodes(self) -> list[UOp]:
        """Every node of the graph, sources before users, each once."""
        return graph_nodes(self.roots)


def graph_nodes(roots: list[UOp]) -> list[UOp]:
    """Every node of the graphs of `roots`, sources before users, each once (no recursion:
    `UOp.toposort` walks with a stack)."""
    order: dict[UOp, None] = {}
    for root in roots:
        order.update(dict.fromkeys(root.toposort))
    return list(order)


# Graphs bigger or deeper than this are not planned whole: viz draws them cut (viz/graph.py).
# Planning runs the scheduler over the whole graph (any depth works: it keeps its own stack),
# while a drawing shows at most a few hundred nodes, so past these sizes viz plans only the
# part it draws and stays quick.
MAX_PLANNED_NODES = 5_000
MAX_PLANNED_DEPTH = 200


def is_plannable(nodes: list[UOp]) -> bool:
    """Whether a graph (its nodes in graph order) is small and shallow enough to plan whole."""
    return len(nodes) <= MAX_PLANNED_NODES and graph_depth(nodes) <= MAX_PLANNED_DEPTH


def graph_depth(nodes: list[UOp]) -> int:
    """The longest path from a leaf to a root, in nodes (`nodes` in graph order)."""
    depth: dict[UOp, int] = {}
    for node in nodes:
        depth[node] = 1 + max((depth[source] for source in node.src), default=0)
    return max(depth.values(), default=0)


def as_uops(targets: tuple[Any, ...]) -> list[UOp]:
    """Tensors or UOps -> UOps."""
    uops = []
    for target in targets:
        uop = getattr(target, "uop", target)
        if not isinstance(uop, UOp):
            raise TypeError(f"expected a Tensor or a UOp, got {type(target).__name__}")
        uops.append(uop)
    return uops


def device_of(targets: tuple[Any, ...], device: str | None) -> str:
    if device is not None:
        return Device.canonicalize(device)
    for target in targets:
        if isinstance(getattr(target, "device", None), str):
            return str(target.device)
    return Device.DEFAULT


def make_plan(targets: tuple[Any, ...], device: str | None = None,
              left_out: set[UOp] | None = None) -> Plan:
    """Schedule the graph of `targets` (Tensors or UOps) as realize() would, without running it.
    `left_out`: BUFFER nodes that stand in for parts of the graph that are not drawn."""
    # a graph with bound Variables is scheduled as realize() does: unbound (sizes by name)
    roots, var_vals = unbind_graph(as_uops(targets))
    schedule = build_schedule(roots, device_of(targets, device), var_vals)
    # keyed by node: an item's number is its place in the run order, which assigns can change
    item_of = {item.node: number for number, item in enumerate(schedule.items)
               if item.node is not None}
    return Plan(roots, schedule.items, schedule.realized, item_of,
                _membership(item_of, schedule.realized), left_out=left_out or set())


def _membership(item_of: dict[UOp, int], realized: dict[UOp, str]) -> dict[UOp, list[int]]:
    """Walk down from each stored node to the buffers it reads; everything on the way is part
    of that node's kernel (numbers in run order, smallest first)."""
    kernels_of: dict[UOp, list[int]] = {}
    for root, number in sorted(item_of.items(), key=lambda pair: pair[1]):
        stack, seen = [root], set()
        while stack:
            node = stack.pop()
            if node in seen:
                continue
            seen.add(node)
            kernels_of.setdefault(node, []).append(number)
            stack.extend(s for s in node.src if s not in realized and s.op is not Ops.BUFFER)
    return kernels_of
