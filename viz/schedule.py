"""`viz.schedule(tensor)`: the kernels a graph becomes, and the reason for every cut and fusion.

What a student sees:
- one cluster per kernel, in the order they run, coloured as in `viz.graph`. Inside: what the
  kernel fused together (in the scheduler's own words, `ScheduleItem.fusions`) and the buffer it
  stores, with the reason it is stored (`ScheduleItem.boundary_reason`);
- an arrow from a kernel's buffer to each kernel that reads it, labelled with why that value had
  to go through memory (`ScheduleItem.input_reasons`); inputs that were already realized are
  cylinders at the top.

Accepts Tensors or UOps (scheduled without running), or the ScheduleItems / launches that
`create_schedule` or `record_launches` gave you.

Builds on: viz/plan.py, viz/figure.py. Used by: viz/graph.py (big graphs), viz/magic.py.
"""
from __future__ import annotations

import textwrap
from typing import Any

from tinyteach.device import Buffer
from tinyteach.schedule import ScheduleItem
from viz.figure import DotWriter, Figure, escape, graph_figure, kernel_color, swatch, table
from viz.plan import make_plan

WRAP = 44  # characters per line inside the drawing


def schedule(*targets: Any, device: str | None = None) -> Figure:
    """Draw the kernels of Tensors/UOps (or of ScheduleItems / Launches) as clusters."""
    items = schedule_items(targets, device)
    noun = "kernel" if len(items) == 1 else "kernels"
    title = f"schedule: {len(items)} {noun}"
    return graph_figure(title, _schedule_dot(items), text_view(items), reasons_table(items))


def schedule_items(targets: tuple[Any, ...], device: str | None = None) -> list[ScheduleItem]:
    """ScheduleItems from whatever the student has: items, launches, or tensors to plan."""
    flat: list[Any] = []
    for target in targets:
        flat.extend(target if isinstance(target, (list, tuple)) else [target])
    if flat and all(isinstance(getattr(t, "item", t), ScheduleItem) for t in flat):
        return [getattr(t, "item", t) for t in flat]
    return make_plan(tuple(flat), device).items


def wrapped(text: str) -> str:
    return "\n".join(textwrap.wrap(text, WRAP)) or text


def kernel_title(number: int, item: ScheduleItem) -> str:
    kind = "copy" if item.kind == "copy" else "kernel"
    return f"{kind} {number + 1}: {item.name} on {item.device}"


def _fusion_label(item: ScheduleItem) -> str:
    if item.kind == "copy":
        return "copies a buffer between devices"
    notes = item.fusions or ["a single op: nothing to fuse"]
    return "\n".join(wrapped(f"• {note}") for note in notes)


def _schedule_dot(items: list[ScheduleItem]) -> str:
    dot = DotWriter("schedule", rankdir="TB", nodesep="0.3", ranksep="0.4")
    producer: dict[Buffer, int] = {item.output: n for n, item in enumerate(items)}
    external: dict[Buffer, str] = {}
    for item in items:
        _external_inputs(dot, item, producer, external)
    for number, item in enumerate(items):
        dot.open_cluster(f"k{number}", kernel_title(number, item), style="rounded,filled",
                         fillcolor=kernel_color(number), color="#777777", fontsize=11)
        dot.node(f"k{number}_ops", _fusion_label(item), shape="box", style="filled",
                 fillcolor="white")
        output = item.output
        stored = f"buffer {output.size} × {output.dtype.name}\nstored because\n"
        dot.node(f"k{number}_out", stored + wrapped(item.boundary_reason), shape="cylinder",
                 style="filled", fillcolor="#f4f4f4")
        dot.edge(f"k{number}_ops", f"k{number}_out", label="store")
        dot.close_cluster()
        _input_edges(dot, number, item, producer, external)
    return dot.source()


def _external_inputs(dot: DotWriter, item: ScheduleItem, producer: dict[Buffer, int],
                     external: dict[Buffer, str]) -> None:
    """Buffers no kernel of this schedule writes: realized tensors, drawn once each."""
    for buffer in item.buffers[1:]:
        if buffer in producer or buffer in external:
            continue
        external[buffer] = f"in{len(external)}"
        label = f"input: a realized buffer\n{buffer.size} × {buffer.dtype.name} on {buffer.device}"
        dot.node(external[buffer], label, shape="cylinder", style="filled", fillcolor="white")


def _input_edges(dot: DotWriter, number: int, item: ScheduleItem, producer: dict[Buffer, int],
                 external: dict[Buffer, str]) -> None:
    reasons = item.input_reasons or [""] * (len(item.buffers) - 1)
    for buffer, reason in zip(item.buffers[1:], reasons):
        source = f"k{producer[buffer]}_out" if buffer in producer else external[buffer]
        bold = buffer in producer
        attrs: dict[str, str | int | float] = {"label": wrapped(reason)} if reason else {}
        if bold:
            attrs.update(penwidth=2, color="#444444")
        dot.edge(source, f"k{number}_ops", **attrs)


def reasons_table(items: list[ScheduleItem]) -> str:
    """Every kernel's reasons in a table, so they can be read (and searched) as text."""
    rows = []
    for number, item in enumerate(items):
        fusions = "<br>".join(escape(note) for note in item.fusions) or "—"
        inputs = "<br>".join(escape(note) for note in item.input_reasons) or "—"
        rows.append([swatch(kernel_color(number)) + escape(kernel_title(number, item)),
                     escape(item.boundary_reason), fusions, inputs])
    return table(rows, ["kernel", "stored because", "fused", "reads"])


def text_view(items: list[ScheduleItem]) -> str:
    lines = [f"schedule: {len(items)} kernel(s)"]
    for number, item in enumerate(items):
        lines.append(kernel_title(number, item))
        lines.append(f"  stored because {item.boundary_reason}")
        lines.extend(f"  fused: {note}" for note in item.fusions)
        lines.extend(f"  reads {note}" for note in item.input_reasons)
    return "\n".join(lines)
