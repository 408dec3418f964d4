"""Small helpers for writing chapter notebooks from Python: cells with stable ids, hidden
solutions, and execution with nbclient (no timestamps, so re-running gives identical files)."""
from __future__ import annotations

import textwrap
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

CHAPTERS = Path(__file__).resolve().parents[1]


def _text(source: str) -> str:
    return textwrap.dedent(source).strip("\n")


class Book:
    """Collects the cells of one notebook; ids are `<prefix>-NN` in order."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.cells: list[nbformat.NotebookNode] = []

    def _id(self) -> str:
        return f"{self.prefix}-{len(self.cells) + 1:02d}"

    def md(self, source: str) -> None:
        cell = nbformat.v4.new_markdown_cell(_text(source))
        cell.id = self._id()
        self.cells.append(cell)

    def code(self, source: str, hidden: bool = False) -> None:
        cell = nbformat.v4.new_code_cell(_text(source))
        cell.id = self._id()
        if hidden:
            cell.metadata["jupyter"] = {"source_hidden": True}
        self.cells.append(cell)

    def solution(self, number: int, source: str) -> None:
        """A heading, then the solution as a code cell whose source starts hidden."""
        self.md(f"#### Solution (click to show): exercise {number}")
        self.code(source, hidden=True)

    def notebook(self) -> nbformat.NotebookNode:
        nb = nbformat.v4.new_notebook()
        nb.nbformat, nb.nbformat_minor = 4, 5
        nb.metadata = {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python", "pygments_lexer": "ipython3"},
        }
        nb.cells = self.cells
        return nb


def write_and_run(book: Book, name: str, execute: bool = True) -> float:
    """Write chapters/<name>; execute it in place; return the seconds execution took."""
    path = CHAPTERS / name
    nb = book.notebook()
    seconds = 0.0
    if execute:
        client = NotebookClient(nb, timeout=120, kernel_name="python3", record_timing=False,
                                resources={"metadata": {"path": str(CHAPTERS)}})
        start = time.perf_counter()
        client.execute()
        seconds = time.perf_counter() - start
        # the language_info nbclient records includes the exact Python version: keep it short
        nb.metadata["language_info"] = {"name": "python", "pygments_lexer": "ipython3"}
    nbformat.validate(nb)
    nbformat.write(nb, path)
    return seconds
