"""viz: the visual layer of tinyteach — graphs, fusion decisions, kernel source and widgets.

Every stage of the stack can be drawn inline in a notebook. viz only *reads* the plain data the
core exposes (the UOp graph, the schedule with its reasons, the stages of a kernel, recorded
launches and rewrite steps); the core never imports viz.

| function           | shows                                                        | module      |
|--------------------|--------------------------------------------------------------|-------------|
| `graph(tensor)`    | the lazy graph, nodes coloured by the kernel they land in    | graph.py    |
| `schedule(tensor)` | the kernels, with the reason for every cut and every fusion  | schedule.py |
| `kernel(tensor)`   | one kernel: AST, linear program, source in every language    | kernel.py   |
| `rewrites(tensor)` | a widget stepping through the rewrite rules that fired       | rewrites.py |
| `launch_graph(launches)` | the kernels that ran and the buffers between them      | launches.py |
| `threads.*(trace)` | GPU threads and memory from the PYTHON emulator's record      | threads.py  |
| `%%tinyteach`      | run a cell, show the kernels it launched (`%load_ext tinyteach`) | magic.py |

Each returns an object a notebook displays as HTML (graphviz's SVG as an image, so it shows
before the notebook is trusted; source highlighted with pygments) and a terminal prints as text.
Without graphviz's `dot`, the views say how to install it and show text instead. Output is
deterministic: the same graph gives the same bytes.

>>> from tinyteach import Tensor
>>> import numpy as np
>>> a = Tensor(np.ones((2, 3), dtype=np.float32))
>>> print(schedule((a + 1).sum(1)).text.splitlines()[1])
kernel 1: r_2_3 on CPU
"""
from __future__ import annotations

from typing import Any

from viz import threads  # a module: viz.threads.thread_map(trace), fragment_layout(trace), ...
from viz.figure import Figure
from viz.graph import graph
from viz.kernel import kernel
from viz.launches import launch_graph
from viz.rewrites import rewrites
from viz.schedule import schedule

__all__ = ["Figure", "graph", "schedule", "kernel", "rewrites", "launch_graph", "threads",
           "load_ipython_extension"]


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext viz` works too; `%load_ext tinyteach` is the name the chapters use."""
    from viz.magic import load_ipython_extension as load

    load(ipython)
