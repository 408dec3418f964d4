"""Small helpers for the chapter generators: cells with stable ids, hidden solutions."""
from __future__ import annotations

import textwrap

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

SETUP = '''\
%load_ext tinyteach
import numpy as np
import viz
from tinyteach import Context, Device, GlobalCounters, Tensor

Device.DEFAULT = "CPU"   # every chapter runs on the CPU device: generated C, compiled here
Tensor.manual_seed(0)
rng = np.random.default_rng(0)
'''


class Book:
    """Collects the cells of one notebook; ids are `<prefix>-01`, `<prefix>-02`, ..."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.cells: list = []

    def _id(self) -> str:
        return f"{self.prefix}-{len(self.cells) + 1:02d}"

    def md(self, text: str) -> None:
        self.cells.append(new_markdown_cell(textwrap.dedent(text).strip(), id=self._id()))

    def code(self, source: str, hidden: bool = False) -> None:
        cell = new_code_cell(textwrap.dedent(source).strip(), id=self._id())
        if hidden:
            cell.metadata["jupyter"] = {"source_hidden": True}
            cell.metadata["tags"] = ["solution"]
        self.cells.append(cell)

    def setup(self, extra: str = "") -> None:
        """The first code cell: the shared setup, then this chapter's imports and helpers."""
        self.code(SETUP + "\n" + textwrap.dedent(extra).strip())

    def exercise(self, title: str, task: str, solution: str) -> None:
        """A "try it" exercise: the task, a cell to work in, the solution (hidden)."""
        self.md(f"**Try it — {title}.** {textwrap.dedent(task).strip()}")
        self.code("# your code here")
        self.md("*Solution* (click the collapsed cell below to show it):")
        self.code(solution, hidden=True)

    def write(self, path: str) -> None:
        nb = new_notebook(cells=self.cells)
        nb.nbformat, nb.nbformat_minor = 4, 5
        nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python",
                                     "name": "python3"}
        nb.metadata["language_info"] = {"name": "python"}
        nbformat.validate(nb)
        nbformat.write(nb, path)
