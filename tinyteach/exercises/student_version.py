"""Chapter 12 (student versions of notebooks): `nbgrader generate_assignment`, without nbgrader.

What this teaches:
- an exercise notebook is written once, with its solution. nbgrader's markers say which lines
  are the solution:

      def add(node, a, b):
          ### BEGIN SOLUTION
          return np.add(a, b, dtype=a.dtype)
          ### END SOLUTION

  and the student version replaces each marked block with a stub at the same indentation:
  `# YOUR CODE HERE` and `raise NotImplementedError()`;
- outputs (and the times each cell ran) are cleared, so the student version gives nothing away;
  the grader then reports every stubbed op as "not implemented".

Instructors with nbgrader installed run `nbgrader generate_assignment` (see README.md); this
module applies the same markers with nothing but the standard library:

    python -m tinyteach.exercises.student_version chapters/12_exercise_backend.ipynb release/

The repository ships the result as exercises/12_exercise_backend_student.ipynb (`make
student-copy` regenerates it; a test checks that it is exactly what this module writes from the
current solutions).

Builds on: nothing. Used by: the Makefile, tests/test_exercises.py and instructors.

>>> solution = "def f():\\n    ### BEGIN SOLUTION\\n    return 1\\n    ### END SOLUTION"
>>> print(strip_solutions(solution))
def f():
    # YOUR CODE HERE
    raise NotImplementedError()
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

MARKER_WORDS = ("BEGIN SOLUTION", "END SOLUTION")  # what nbgrader looks for in a line
STUB = ("# YOUR CODE HERE", "raise NotImplementedError()")
TEXT_STUB = ("YOUR ANSWER HERE",)  # a solution in a markdown cell


def strip_solutions(source: str, stub: tuple[str, ...] = STUB) -> str:
    """Replace each BEGIN/END SOLUTION block by the stub, indented as the BEGIN line. As in
    nbgrader, a line that contains a marker anywhere counts as that marker."""
    kept: list[str] = []
    inside = False
    for line in source.splitlines():
        if MARKER_WORDS[0] in line:
            if inside:
                raise ValueError("a BEGIN SOLUTION inside another solution block")
            indent = line[: len(line) - len(line.lstrip())]
            kept += [indent + stub_line for stub_line in stub]
            inside = True
        elif MARKER_WORDS[1] in line:  # (nbgrader drops a stray END line too)
            inside = False
        elif not inside:
            kept.append(line)
    if inside:
        raise ValueError("a BEGIN SOLUTION without its END SOLUTION")
    return "\n".join(kept)


def has_solution(cell: dict[str, Any]) -> bool:
    source = "".join(cell["source"])
    return any(word in source for word in MARKER_WORDS)


def student_notebook(notebook: dict[str, Any]) -> dict[str, Any]:
    """A copy of the notebook with solutions stubbed and every output cleared."""
    student = copy.deepcopy(notebook)
    for cell in student["cells"]:
        if has_solution(cell):
            stub = STUB if cell["cell_type"] == "code" else TEXT_STUB
            source = strip_solutions("".join(cell["source"]), stub)
            cell["source"] = source.splitlines(keepends=True)
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
        # when each cell last ran (nbconvert's timestamps): not the student's business, and it
        # would change the student version every time the chapter is executed
        cell.get("metadata", {}).pop("execution", None)
    return student


def student_text(source: Path) -> str:
    """The student version of the notebook `source`, as the text of an .ipynb file."""
    notebook = json.loads(source.read_text(encoding="utf-8"))
    return json.dumps(student_notebook(notebook), indent=1, ensure_ascii=False) + "\n"


def write_student_version(source: Path, destination: Path) -> Path:
    """Write the student version of `source` to `destination`: a file if it ends in .ipynb,
    else a folder (the file keeps the notebook's name)."""
    target = destination if destination.suffix == ".ipynb" else destination / source.name
    if target.resolve() == source.resolve():
        raise ValueError(f"the student version would overwrite its source {source}")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(student_text(source), encoding="utf-8")
    return target


def main(arguments: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the student version of a notebook.")
    parser.add_argument("notebook", type=Path, help="the notebook with its solutions")
    parser.add_argument("destination", type=Path, nargs="?", default=Path("release"),
                        help="folder for the student version (default: release/), or the "
                             "path of the .ipynb file to write")
    options = parser.parse_args(arguments)
    print(f"wrote {write_student_version(options.notebook, options.destination)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
