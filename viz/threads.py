"""Threads and memory, drawn from the PYTHON emulator's record (tinyteach/runtime/python.py).

What a student sees:
- `thread_map(trace, "data1")`: GPU-Puzzles style, one square per element of a buffer,
  labelled with the number (within its group) of the thread that read (or wrote) it. With
  several work-groups each group has a colour of its own, in two shades for even and odd
  threads; with one group each thread has its own colour. Long rows wrap (`wrap`), with the
  first element's address at the left of each drawn line;
- `launch_grid(trace)`: the launch as a grid of work-groups, each a box of its threads in the
  group's colour, with the warps (32 consecutive threads) outlined;
- `access_pattern(trace)`: for every load and store of the program, the addresses that the
  first threads of a group touch in the same step, and the 32-byte *sectors* the first warp
  touches. Neighbouring threads at neighbouring addresses (stride 1) are *coalesced*: a warp of
  32 threads reading 32 floats moves 4 sectors; a stride of a whole row moves one per thread;
- `shared_traffic(trace)`: reads and writes of shared memory in each barrier phase (the steps
  between two barriers), per group: the tree's halving shows as phases with half the traffic;
- `launch_summary(trace)`: groups, threads per group, shared bytes, barriers, and the loads and
  stores of one thread;
- `fragment_layout(trace)`: a tensor core's fragments — A, B and D of the instruction, each
  element labelled with the lane of the warp that holds it;
- `block_layout(block)`: a tensor-core block (wmma.TensorCoreBlock): which warp computes which
  16x8 tile of the work-group's block of outputs.

Every function but `block_layout` reads a `Trace` recorded with `record_threads()` (or
`emulate(..., record=True)`) and returns a `Figure`: an SVG image in a notebook, text in a
terminal. Nothing runs again; output is deterministic (the same trace gives the same bytes).

Builds on: tinyteach.runtime.python (Trace, AccessEvent), viz/figure.py.

>>> import numpy as np
>>> from tinyteach import Tensor
>>> from tinyteach.runtime.python import record_threads
>>> with record_threads() as traces:
...     _ = (Tensor(np.ones((2, 4), np.float32), device="PYTHON") * 2).numpy()
>>> print(launch_summary(traces[0]).text.splitlines()[1])
work-groups: 1 x 1 x 1 = 1, threads per group: 4 x 2 x 1 = 8
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from tinyteach.codegen.wmma import TensorCoreBlock
from tinyteach.opt.search import SECTOR_BYTES, WARP_THREADS
from tinyteach.runtime.python import AccessEvent, Trace
from viz.figure import Figure, escape, preformatted, svg_image, table, wrap

CELL = 26       # pixels per drawn element
MAX_CELLS = 1024  # larger buffers are drawn in part, with a note
WRAP = 32       # a drawn line holds at most this many elements; longer rows wrap
MARGIN = 44     # pixels at the left of a wrapped drawing, for each line's first address
MAX_GROUPS = 64  # launch_grid draws at most this many work-groups (and MAX_CELLS threads)


@dataclass(frozen=True)
class Stride:
    """How far apart neighbouring threads' addresses are in one step (None: irregular)."""

    step: int
    buffer: str
    kind: str
    stride: int | None
    addresses: tuple[int, ...]   # of the first threads of the first group
    warp_lanes: int = 0          # threads of the first group's first warp in this step
    sectors: int = 0             # the 32-byte sectors those threads touch
    itemsize: int = 4            # bytes per element

    @property
    def fewest_sectors(self) -> int:
        """The sectors the warp's lanes would need at consecutive addresses (coalesced)."""
        return -(-self.warp_lanes * self.itemsize // SECTOR_BYTES)

    @property
    def verdict(self) -> str:
        if len(self.addresses) == 1:
            return "one thread"
        if self.stride == 1:
            return "coalesced"
        if self.stride == 0:
            return "broadcast"
        if self.stride is None:
            return "irregular"
        return f"strided ({self.stride})"


def thread_color(thread: int) -> str:
    """Thread (or lane) `thread`'s colour: hues the golden angle apart, so that the 32 lanes
    of a warp all differ and neighbours differ most."""
    return f"hsl({(thread * 137.508) % 360:.0f}, 60%, 76%)"


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def element_color(group: int, thread: int, several_groups: bool) -> str:
    """How thread_map and launch_grid colour a thread: by its group when there are several
    (`group_color`), else by the thread itself (`thread_color`)."""
    return group_color(group, thread) if several_groups else thread_color(thread)


def group_color(group: int, thread: int = 0) -> str:
    """Work-group `group`'s colour: a hue of its own (the golden angle apart, so that
    neighbouring groups differ most), light for even threads and darker for odd ones."""
    hue = (group * 137.508) % 360
    lightness = 80 if thread % 2 == 0 else 66
    return f"hsl({hue:.0f}, 65%, {lightness}%)"


def _linear_thread(threads: np.ndarray, local_size: tuple[int, int, int]) -> np.ndarray:
    return threads[:, 0] + local_size[0] * (threads[:, 1] + local_size[1] * threads[:, 2])


def _svg(width: int, height: int, parts: list[str]) -> str:
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="Helvetica" font-size="10">')
    return "\n".join([head, *parts, "</svg>"])


def _cell(x: int, y: int, fill: str, label: str, tip: str) -> str:
    return (f'<g><title>{escape(tip)}</title><rect x="{x}" y="{y}" width="{CELL - 2}" '
            f'height="{CELL - 2}" fill="{fill}" stroke="#666" stroke-width="0.5"/>'
            f'<text x="{x + CELL // 2 - 1}" y="{y + CELL // 2 + 3}" text-anchor="middle">'
            f'{escape(label)}</text></g>')


def _figure(title: str, svg: str, text: str, notes: list[str]) -> Figure:
    notes_html = "".join(f'<div style="font-size:12px">{escape(n)}</div>' for n in notes)
    body = f'<div class="tinyteach-threads">{svg_image(svg, title)}</div>{notes_html}'
    return Figure(title, wrap(title, body), text, None, svg, notes)


# ---- which thread touches which element ----

def thread_map(trace: Trace, buffer: str = "data1", kind: str = "read",
               columns: int | None = None, wrap: int = WRAP) -> Figure:
    """One square per element of `buffer`, labelled by the thread (its number within its
    group) that read it (`kind="write"`: wrote it); `*` marks an element touched by several
    threads, blank squares were not touched. Colours: with several work-groups, the group
    (`group_color`: a hue per group, two shades for even and odd threads); with one, the
    thread. `columns`: elements per row of the buffer; a row longer than `wrap` is drawn on
    several lines, each starting with the address of its first element."""
    if buffer not in trace.buffer_sizes:
        raise ValueError(f"{trace.name} has no buffer {buffer!r}; it has "
                         f"{sorted(trace.buffer_sizes)}")
    if wrap < 1:
        raise ValueError(f"wrap must be at least 1 element per line, not {wrap}")
    size = min(trace.buffer_sizes[buffer], MAX_CELLS)
    owners = _owners(trace, buffer, kind)
    by_group = trace.launch.group_count > 1
    columns = columns or min(size, 16)
    place = _Layout(columns, wrap)
    parts, lines = [], []
    for address in range(size):
        x, y = place.position(address)
        who = sorted(owners.get(address, set()))
        if not who:
            parts.append(_cell(x, y, "#ffffff", "", f"{buffer}[{address}]: not touched"))
            continue
        label = str(who[0][1]) if len(who) == 1 else "*"
        tip = f"{buffer}[{address}]: " + ", ".join(f"group {g} thread {t}" for g, t in who)
        parts.append(_cell(x, y, element_color(*who[0], by_group), label, tip))
        lines.append(tip)
    parts += place.address_labels(size)
    notes = [] if size == trace.buffer_sizes[buffer] else \
        [f"the first {size} of {trace.buffer_sizes[buffer]} elements"]
    notes.append("colour: the work-group (a shade for even threads, one for odd)" if by_group
                 else "one work-group: a colour per thread")
    if place.wraps:
        notes.append(f"rows of {columns} elements drawn in lines of {place.per_line}")
    verb = "reads" if kind == "read" else "writes"
    title = f"{trace.name}: which thread {verb} each element of {buffer}"
    width, height = place.size(size)
    return _figure(title, _svg(width, height, parts), "\n".join([title, *lines]), notes)


def _owners(trace: Trace, buffer: str, kind: str) -> dict[int, set[tuple[int, int]]]:
    """Each touched address of `buffer` -> the (group, thread) numbers that touched it."""
    owners: dict[int, set[tuple[int, int]]] = {}
    for event in trace.accesses(kind, buffer):
        group_ids = _linear_thread(event.groups, trace.launch.groups)
        thread_ids = _linear_thread(event.threads, trace.launch.local_size)
        for group, thread, address in zip(group_ids, thread_ids, event.addresses):
            owners.setdefault(int(address), set()).add((int(group), int(thread)))
    return owners


@dataclass(frozen=True)
class _Layout:
    """Where thread_map draws each element: rows of `columns` elements, each row cut into
    drawn lines of at most `wrap`, a small gap between rows when they wrap."""

    columns: int
    wrap: int

    @property
    def per_line(self) -> int:
        return min(self.columns, self.wrap)

    @property
    def wraps(self) -> bool:
        return self.columns > self.wrap

    @property
    def lines_per_row(self) -> int:
        return -(-self.columns // self.per_line)

    def _line_top(self, row: int, segment: int) -> int:
        gap = CELL // 3 if self.wraps else 0
        return (row * self.lines_per_row + segment) * CELL + row * gap

    def position(self, address: int) -> tuple[int, int]:
        row, column = divmod(address, self.columns)
        segment, x = divmod(column, self.per_line)
        left = MARGIN if self.wraps else 0
        return left + x * CELL, self._line_top(row, segment)

    def address_labels(self, size: int) -> list[str]:
        """The address of each drawn line's first element, at its left (wrapped rows only)."""
        if not self.wraps:
            return []
        labels = []
        for row in range(-(-size // self.columns)):
            for segment in range(self.lines_per_row):
                first = row * self.columns + segment * self.per_line
                if first >= size:
                    break
                top = self._line_top(row, segment)
                labels.append(f'<text x="{MARGIN - 6}" y="{top + CELL // 2 + 3}" '
                              f'text-anchor="end" fill="#555">{first}</text>')
        return labels

    def size(self, elements: int) -> tuple[int, int]:
        """The drawing's width and height for `elements` elements."""
        rows = max(-(-elements // self.columns), 1)
        left = MARGIN if self.wraps else 0
        bottom = self._line_top(rows - 1, self.lines_per_row - 1) + CELL
        return left + self.per_line * CELL, bottom


# ---- the launch as a grid of work-groups ----

def launch_grid(trace: Trace, warp: int = WARP_THREADS) -> Figure:
    """The launch's work-groups as boxes, in the order of their numbers (a row of the grid's
    first dimension per line, where it fits); in each, a square per thread (labelled with its
    number in the group, coloured as thread_map colours it), and a dashed frame around each
    warp: `warp` consecutive thread numbers."""
    launch = trace.launch
    threads, local = launch.threads_per_group, launch.local_size
    box = _GroupBox(threads, min(threads, WRAP), warp, launch.group_count > 1)
    shown = min(launch.group_count, MAX_GROUPS, max(1, MAX_CELLS // threads))
    fits = max(1, 1200 // (box.width + 10))
    across = launch.groups[0] if 1 < launch.groups[0] <= fits else min(shown, fits)
    parts, lines = [], [f"{trace.name}: {_plural(launch.group_count, 'work-group')} of "
                        f"{_plural(threads, 'thread')} ({local[0]} x {local[1]} x {local[2]}), "
                        f"warps of {warp}"]
    for number in range(shown):
        group_id = _group_id(number, launch.groups)
        left, top = (number % across) * (box.width + 10), (number // across) * (box.height + 10)
        parts += box.draw(number, group_id, left, top)
        lines.append(f"group {number} {group_id}: threads 0..{threads - 1}, "
                     f"{_plural(-(-threads // warp), 'warp')}")
    notes = [f"a warp is {warp} consecutive threads of a group, run together"]
    if shown < launch.group_count:
        notes.append(f"the first {shown} of {launch.group_count} work-groups")
    rows = -(-shown // across)
    svg = _svg(across * (box.width + 10), rows * (box.height + 10), parts)
    return _figure(lines[0], svg, "\n".join(lines), notes)


def _group_id(number: int, groups: tuple[int, int, int]) -> tuple[int, int, int]:
    """Work-group `number`'s 3-d id (x fastest, as _linear_thread numbers them)."""
    return number % groups[0], (number // groups[0]) % groups[1], number // (groups[0] * groups[1])


@dataclass(frozen=True)
class _GroupBox:
    """One work-group of launch_grid: its threads in lines of `per_line`, warps framed."""

    threads: int
    per_line: int
    warp: int
    several_groups: bool

    @property
    def width(self) -> int:
        return self.per_line * CELL + 12

    @property
    def height(self) -> int:
        return -(-self.threads // self.per_line) * CELL + 28

    def draw(self, number: int, group_id: tuple[int, int, int], left: int, top: int) -> list[str]:
        parts = [f'<rect x="{left}" y="{top}" width="{self.width}" height="{self.height}" '
                 f'fill="none" stroke="#333" stroke-width="1.5" rx="4"/>',
                 f'<text x="{left + 6}" y="{top + 14}" font-size="11">group {number} '
                 f'{group_id}</text>']
        for thread in range(self.threads):
            row, column = divmod(thread, self.per_line)
            tip = f"group {number} {group_id}, thread {thread}, warp {thread // self.warp}"
            fill = element_color(number, thread, self.several_groups)
            parts.append(_cell(left + 6 + column * CELL, top + 20 + row * CELL, fill,
                               str(thread), tip))
        return parts + _warp_frames(self.threads, self.per_line, self.warp, left + 6, top + 20)


def _warp_frames(threads: int, per_line: int, warp: int, left: int, top: int) -> list[str]:
    """A dashed frame around each drawn line's part of each warp."""
    frames = []
    for first in range(0, threads, warp):
        last = min(first + warp, threads) - 1
        for row in range(first // per_line, last // per_line + 1):
            start = max(first, row * per_line) - row * per_line
            stop = min(last, (row + 1) * per_line - 1) - row * per_line
            frames.append(f'<rect x="{left + start * CELL - 1}" y="{top + row * CELL - 1}" '
                          f'width="{(stop - start + 1) * CELL}" height="{CELL}" fill="none" '
                          f'stroke="#000" stroke-width="1.5" stroke-dasharray="4 2"/>')
    return frames


# ---- coalesced or strided ----

def strides(trace: Trace, threads: int = 8, itemsize: int = 4) -> list[Stride]:
    """For each load and store step of global memory (in program order, first time only): the
    addresses of the first `threads` threads of the first group that ran it, their stride, and
    the 32-byte sectors the group's first warp touched (elements of `itemsize` bytes: the
    record holds element indices)."""
    found: dict[tuple[int, str], Stride] = {}
    for event in trace.events:
        if event.is_shared or (event.step, event.kind) in found:
            continue
        found[(event.step, event.kind)] = _stride_of(event, trace, threads, itemsize)
    return [found[key] for key in sorted(found)]


def _stride_of(event: AccessEvent, trace: Trace, threads: int, itemsize: int) -> Stride:
    group_ids = _linear_thread(event.groups, trace.launch.groups)
    in_first = group_ids == group_ids.min()
    first = event.addresses[in_first]
    thread_ids = _linear_thread(event.threads, trace.launch.local_size)[in_first]
    order = np.argsort(thread_ids, kind="stable")[:threads]
    addresses = tuple(int(a) for a in first[order])
    gaps = {b - a for a, b in zip(addresses, addresses[1:])}
    stride = gaps.pop() if len(gaps) == 1 else None
    first_warp = thread_ids // WARP_THREADS == (thread_ids // WARP_THREADS).min()
    warp_sectors = np.unique(first[first_warp] * itemsize // SECTOR_BYTES)
    return Stride(event.step, event.buffer, event.kind, stride, addresses,
                  int(first_warp.sum()), len(warp_sectors), itemsize)


def access_pattern(trace: Trace, threads: int = 8, itemsize: int = 4) -> Figure:
    """A row per global load or store: the addresses of threads 0, 1, 2, ... in one step,
    whether they are coalesced (neighbours at neighbouring addresses) or strided, and the
    32-byte sectors the first warp moves, against the fewest its threads could need."""
    found = strides(trace, threads, itemsize)
    parts, lines = [], [f"{trace.name}: addresses of threads 0..{threads - 1} in one step"]
    label_width = 170
    width = label_width + threads * CELL
    for row, stride in enumerate(found):
        y = row * CELL
        caption = f"%{stride.step} {stride.kind} {stride.buffer}: {stride.verdict}"
        warp = (f"warp 0: {_plural(stride.warp_lanes, 'thread')}, "
                f"{_plural(stride.sectors, 'sector')} (fewest {stride.fewest_sectors})")
        parts.append(f'<text x="0" y="{y + CELL // 2 + 3}">{escape(caption)}</text>')
        for column, address in enumerate(stride.addresses):
            parts.append(_cell(label_width + column * CELL, y, thread_color(column),
                               str(address), f"thread {column}: {stride.buffer}[{address}]"))
        parts.append(f'<text x="{width + 8}" y="{y + CELL // 2 + 3}">{escape(warp)}</text>')
        lines.append(f"{caption:<32} {str(list(stride.addresses)):<28} {warp}")
    svg = _svg(width + 260, max(len(found), 1) * CELL, parts)
    return _figure(lines[0], svg, "\n".join(lines),
                   [f"memory moves in {SECTOR_BYTES}-byte sectors, for a warp of "
                    f"{WARP_THREADS} threads at once: coalesced, its threads share sectors; "
                    "strided, each thread needs its own"])


# ---- shared memory per barrier phase ----

def phase_traffic(trace: Trace) -> list[tuple[int, int, int]]:
    """(phase, reads, writes) of shared memory per work-group, phases in order."""
    groups = max(trace.launch.group_count, 1)
    reads: Counter[int] = Counter()
    writes: Counter[int] = Counter()
    for event in trace.events:
        if event.is_shared:
            (reads if event.kind == "read" else writes)[event.phase] += len(event.addresses)
    phases = sorted(set(reads) | set(writes))
    return [(p, reads[p] // groups, writes[p] // groups) for p in phases]


def shared_traffic(trace: Trace) -> Figure:
    """Bars of shared-memory reads and writes per group in each barrier phase."""
    traffic = phase_traffic(trace)
    title = f"{trace.name}: shared memory per barrier phase (per work-group)"
    if not traffic:
        return Figure(title, wrap(title, preformatted("no shared memory used")),
                      f"{title}\nno shared memory used")
    largest = max(max(r, w) for _, r, w in traffic)
    scale = 160 / max(largest, 1)
    parts, lines = [], [title]
    for row, (phase, reads, writes) in enumerate(traffic):
        y = row * 2 * CELL
        parts.append(f'<text x="0" y="{y + 14}">phase {phase}</text>')
        for offset, (name, count, color) in enumerate((("reads", reads, "#80b1d3"),
                                                       ("writes", writes, "#fb8072"))):
            top = y + offset * (CELL - 4)
            parts.append(f'<rect x="60" y="{top + 2}" width="{max(count * scale, 1):.1f}" '
                         f'height="{CELL - 8}" fill="{color}"/>')
            parts.append(f'<text x="{66 + count * scale:.1f}" y="{top + 14}">'
                         f'{count} {name}</text>')
        lines.append(f"phase {phase}: {reads} reads, {writes} writes")
    svg = _svg(300, len(traffic) * 2 * CELL, parts)
    return _figure(title, svg, "\n".join(lines),
                   ["a phase is the steps between two barriers"])


# ---- the launch in numbers ----

def launch_summary(trace: Trace) -> Figure:
    """Groups, threads, shared bytes, barriers, and one thread's loads and stores (global and
    shared; the most any thread did)."""
    launch = trace.launch
    per_thread: dict[tuple[str, bool], Counter[tuple[int, int]]] = {}
    for event in trace.events:
        counts = per_thread.setdefault((event.kind, event.is_shared), Counter())
        keys = zip(_linear_thread(event.groups, launch.groups).tolist(),
                   _linear_thread(event.threads, launch.local_size).tolist())
        counts.update(keys)
    g, size = launch.groups, launch.local_size
    rows = [
        ["work-groups", f"{g[0]} x {g[1]} x {g[2]} = {launch.group_count}"],
        ["threads per group", f"{size[0]} x {size[1]} x {size[2]} = "
                              f"{launch.threads_per_group}"],
        ["shared memory", f"{trace.shared_bytes} bytes per group"],
        ["barriers", str(trace.barriers)],
    ]
    for kind, shared in (("read", False), ("write", False), ("read", True), ("write", True)):
        counts = per_thread.get((kind, shared), Counter())
        most = max(counts.values(), default=0)
        place = "shared" if shared else "global"
        name = f"{place} {'loads' if kind == 'read' else 'stores'} per thread (max)"
        rows.append([name, str(most)])
    title = f"{trace.name}: launch summary"
    text = "\n".join([title, f"work-groups: {rows[0][1]}, threads per group: {rows[1][1]}",
                      *[f"{name}: {value}" for name, value in rows[2:]]])
    html = table([[escape(name), escape(value)] for name, value in rows], ["", ""])
    return Figure(title, wrap(title, html), text)


# ---- a tensor core's fragments: which lane holds which element ----

def _fragment_grid(name: str, cells: np.ndarray, rows: int, columns: int, x0: int,
                   y0: int) -> tuple[list[str], list[str]]:
    """SVG cells and text rows of one matrix: `cells[lane, i]` is the (row, column) of lane's
    i-th element; each square shows the lane that holds it."""
    holder = np.full((rows, columns), -1)
    element = np.full((rows, columns), -1)
    for lane in range(cells.shape[0]):
        for i in range(cells.shape[1]):
            row, column = (int(v) for v in cells[lane, i])
            holder[row, column], element[row, column] = lane, i
    parts = [f'<text x="{x0}" y="{y0 - 6}" font-size="12">{escape(name)}</text>']
    for row in range(rows):
        for column in range(columns):
            lane, i = int(holder[row, column]), int(element[row, column])
            tip = f"{name}[{row}, {column}]: lane {lane}, element {i}"
            parts.append(_cell(x0 + column * CELL, y0 + row * CELL, thread_color(lane),
                               str(lane), tip))
    text = [f"{name} (lane holding each element):"]
    text += [" ".join(f"{int(lane):2d}" for lane in holder[row]) for row in range(rows)]
    return parts, text


def fragment_layout(trace: Trace) -> Figure:
    """The layout of the first tensor-core instruction the trace ran: three matrices, A (m x k),
    B (k x n) and D (m x n), each square labelled with the lane (thread of the warp) that holds
    that element in its registers, coloured by lane. Read from the record (FragmentEvent)."""
    if not trace.fragments:
        raise ValueError(f"{trace.name} ran no tensor-core instruction (WMMA): record a kernel "
                         "lowered with KernelOptions(tensor_core=True)")
    first = trace.fragments[0]
    events = [e for e in trace.fragments if e.instruction == first.instruction]
    m, n, k = first.shape
    c_cells = np.zeros((first.c_cells.shape[0], max(e.element for e in events) + 1, 2), int)
    for event in events:
        c_cells[:, event.element] = event.c_cells
    grids = [("A", first.a_cells, m, k), ("B", first.b_cells, k, n), ("D", c_cells, m, n)]
    parts, lines, x = [], [f"{trace.name}: fragments of {first.instruction}"], 0
    for name, cells, rows, columns in grids:
        grid, text = _fragment_grid(name, cells, rows, columns, x, 18)
        parts += grid
        lines += text
        x += columns * CELL + 20
    height = 18 + max(rows for _, _, rows, _ in grids) * CELL
    notes = [f"{first.instruction}: each of {first.a_cells.shape[0]} lanes holds "
             f"{first.a_cells.shape[1]} elements of A, {first.b_cells.shape[1]} of B and "
             f"{c_cells.shape[1]} of D"]
    title = f"{trace.name}: which lane holds which element ({first.instruction})"
    return _figure(title, _svg(x, height, parts), "\n".join(lines), notes)


def block_layout(block: TensorCoreBlock) -> Figure:
    """The tiles of a tensor-core block, each square one tile of the instruction (m x n
    outputs) labelled and coloured by the warp that computes it (`TensorCoreBlock.warp_map`,
    the definition the lowering uses)."""
    owner = block.warp_map
    core = block.core
    parts, lines = [], [f"{block!r}: warp computing each {core.m}x{core.n} tile"]
    for row in range(owner.shape[0]):
        for column in range(owner.shape[1]):
            warp = int(owner[row, column])
            tip = (f"rows {row * core.m}..{(row + 1) * core.m - 1}, columns "
                   f"{column * core.n}..{(column + 1) * core.n - 1}: warp {warp}")
            parts.append(_cell(column * CELL, row * CELL, thread_color(warp), str(warp), tip))
        lines.append(" ".join(str(int(w)) for w in owner[row]))
    notes = [f"{block.warp_count} warps of {core.threads} threads; each tile is one "
             f"{core.name} per {core.k} steps of the reduction"]
    title = f"tensor-core block {block.rows}x{block.columns}: which warp computes which tile"
    svg = _svg(owner.shape[1] * CELL, owner.shape[0] * CELL, parts)
    return _figure(title, svg, "\n".join(lines), notes)
