"""Chapter 12 (report): one row per op, as a text table (terminal) or an HTML table (notebook).

What this teaches:
- a good autograder says more than "failed": for each failing op it shows the input, the
  expected and the received values, and a hint about the edge case that usually goes wrong;
- Jupyter shows an object's `_repr_html_` when it is the last expression of a cell, so the same
  `GradeReport` prints as text in a terminal and as a table in a notebook, without importing
  IPython (nothing under tinyteach/ does).

Builds on: nothing but numpy. Used by: autograder.py.

>>> report = GradeReport("demo", [Row("ADD", PASS), Row("MUL", NOT_IMPLEMENTED)])
>>> report.passed, report.summary()
(False, 'demo: 1 of 2 pass, 0 fail, 1 not implemented')
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field

import numpy as np

PASS, FAIL, NOT_IMPLEMENTED, SKIPPED = "pass", "fail", "not implemented", "skipped"
COLORS = {PASS: "#d9f2d9", FAIL: "#f8d0d0", NOT_IMPLEMENTED: "#eeeeee", SKIPPED: "#fff4cc"}


def show(value: object) -> str:
    """An array as one readable line with its dtype; anything else as repr."""
    if isinstance(value, np.ndarray):
        text = np.array2string(value, precision=6, separator=", ", threshold=40)
        return f"{' '.join(text.split())} ({value.dtype})"
    return repr(value)


@dataclass
class Failure:
    """What one failing case looked like."""

    case: str
    inputs: str
    expected: str
    received: str


@dataclass
class Row:
    """One line of the report: an op (or a check such as the JIT) and how it went."""

    name: str
    status: str
    note: str = ""
    failure: Failure | None = None
    hint: str = ""

    def details(self) -> list[str]:
        """The lines printed under the table for a failure."""
        if self.failure is None:
            return []
        lines = [f"{self.name}: {self.failure.case}"]
        if self.failure.inputs:
            lines.append(f"  input:    {self.failure.inputs}")
        lines += [f"  expected: {self.failure.expected}", f"  received: {self.failure.received}"]
        return lines + ([f"  hint:     {self.hint}"] if self.hint else [])


@dataclass
class GradeReport:
    """Every row of one grading run; `passed` is True when nothing failed or is missing."""

    title: str
    rows: list[Row] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(row.status == PASS for row in self.rows)

    def count(self, status: str) -> int:
        return sum(row.status == status for row in self.rows)

    def summary(self) -> str:
        text = (f"{self.title}: {self.count(PASS)} of {len(self.rows)} pass, "
                f"{self.count(FAIL)} fail, {self.count(NOT_IMPLEMENTED)} not implemented")
        skipped = self.count(SKIPPED)
        return text + (f", {skipped} skipped" if skipped else "")

    def __str__(self) -> str:
        width = max(len(row.name) for row in self.rows) if self.rows else 4
        lines = [self.summary(), ""]
        lines += [f"  {row.name:<{width}}  {row.status:<15}  {row.note}".rstrip()
                  for row in self.rows]
        for row in self.rows:
            if row.failure is not None:
                lines += ["", *row.details()]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        cells = "".join(html_row(row) for row in self.rows)
        return (f"<div class='tinyteach-grade'><b>{html.escape(self.summary())}</b>"
                f"<table><tr><th>op</th><th>result</th><th>details</th></tr>{cells}</table></div>")


def html_row(row: Row) -> str:
    style = f"background:{COLORS[row.status]};text-align:left"
    details = html.escape(row.note)
    if row.failure is not None:
        details = f"<pre style='margin:0'>{html.escape(chr(10).join(row.details()[1:]))}</pre>"
        details = f"{html.escape(row.failure.case)}{details}"
    return (f"<tr><td><code>{html.escape(row.name)}</code></td><td style='{style}'>{row.status}"
            f"</td><td style='text-align:left'>{details}</td></tr>")
