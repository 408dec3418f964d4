"""`viz.schedule(tensor)`: the kernels a graph becomes, and the reason for every cut and fusion.

What a student sees:
- one cluster per kernel, in the order they run, coloured as in `viz.graph`. Inside: what the
  kernel fused together (in the scheduler's own words, `ScheduleItem.fusions`) and the buffer it
  stores, with the reason it is stored (`ScheduleItem.boundary_reason`);
- an arrow from a kernel's buffer to each kernel that reads it, labelled with why that value had
  to go through memory (`ScheduleItem.input_reasons`); inputs that were already realized are
  cylinders at the top.

Accepts Tensors or UOps (scheduled without running), or the ScheduleItems / launches that
`create_schedule` or `record_launches` gave you. Schedules longer than `max_kernels` are cut:
the last kernels are drawn, with a note of how many came before.

Builds on: viz/plan.py, viz/figure.py. Used by: viz/graph.py (big graphs), viz/magic.py.
"""
from __future__ import annotations

import textwrap
from typing import Any

from tinyteach.device import Buffer
from tinyteach.engine.schedule import ScheduleItem
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
from viz.plan import make_plan

WRAP = 44  # characters per line inside the drawing
DEFAULT_MAX_KERNELS = 40


def schedule(*targets: Any, device: str | None = None,
             max_kernels: int | None = DEFAULT_MAX_KERNELS) -> Figure:
    """Draw the kernels of Tensors/UOps (or of ScheduleItems / Launches) as clusters."""
    if max_kernels is not None and max_kernels < 1:
        raise ValueError(f"max_kernels must be at least 1 (or None for no limit), "
                         f"got {max_kernels}")
    items = schedule_items(targets, device)
    first = 0 if max_kernels is None else max(0, len(items) - max_kernels)
    noun = "kernel" if len(items) == 1 else "kernels"
    title = f"schedule: {len(items)} {noun}"
    figure = graph_figure(title, _schedule_dot(items, first), text_view(items, first),
                          reasons_table(items, first))
    if first:
        figure.html = notice(left_out_note(len(items), first)) + figure.html
    return figure


def left_out_note(count: int, first: int) -> str:
    return (f"This schedule has {count} kernels: drawn are the last {count - first}, the first "
            f"{first} are left out. schedule(..., max_kernels=None) draws every kernel.")


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


def _schedule_dot(items: list[ScheduleItem], first: int = 0) -> str:
    """Kernels `first` and after; the buffers earlier kernels wrote are drawn as inputs."""
    dot = DotWriter("schedule", rankdir="TB", nodesep="0.3", ranksep="0.4")
    producer: dict[Buffer, int] = {item.output: n for n, item in enumerate(items) if n >= first}
    left_out = {item.output for item in items[:first]}
    external: dict[Buffer, str] = {}
    for item in items[first:]:
        _external_inputs(dot, item, producer, external, left_out)
    for number, item in enumerate(items[first:], start=first):
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
                     external: dict[Buffer, str], left_out: set[Buffer]) -> None:
    """Buffers no drawn kernel writes: realized tensors (or a left-out kernel's result), drawn
    once each."""
    for buffer in item.buffers[1:]:
        if buffer in producer or buffer in external:
            continue
        external[buffer] = f"in{len(external)}"
        what = "written by a left-out kernel" if buffer in left_out else "a realized buffer"
        label = f"input: {what}\n{buffer.size} × {buffer.dtype.name} on {buffer.device}"
        style = "filled,dashed" if buffer in left_out else "filled"
        dot.node(external[buffer], label, shape="cylinder", style=style, fillcolor="white")


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


def reasons_table(items: list[ScheduleItem], first: int = 0) -> str:
    """Every drawn kernel's reasons in a table, so they can be read (and searched) as text."""
    rows = []
    for number, item in enumerate(items[first:], start=first):
        fusions = "<br>".join(escape(note) for note in item.fusions) or "—"
        inputs = "<br>".join(escape(note) for note in item.input_reasons) or "—"
        rows.append([swatch(kernel_color(number)) + escape(kernel_title(number, item)),
                     escape(item.boundary_reason), fusions, inputs])
    return table(rows, ["kernel", "stored because", "fused", "reads"])


def text_view(items: list[ScheduleItem], first: int = 0) -> str:
    lines = [f"schedule: {len(items)} kernel(s)"]
    if first:
        lines.append(left_out_note(len(items), first))
    for number, item in enumerate(items[first:], start=first):
        lines.append(kernel_title(number, item))
        lines.append(f"  stored because {item.boundary_reason}")
        lines.extend(f"  fused: {note}" for note in item.fusions)
        lines.extend(f"  reads {note}" for note in item.input_reasons)
    return "\n".join(lines)
