"""The book's one build path: each chapter's source, `chapters/src/NN_name.py` (jupytext's percent
format), becomes `chapters/NN_name.ipynb`, executed with the book's settings.

    python chapters/book.py build 08_codegen [09_devices ...]  # rebuild, execute (make chapter)
    python chapters/book.py build --all                        # every chapter (make chapters)
    python chapters/book.py build --keep-outputs 08_codegen    # prose-only edit: no re-run
    python chapters/book.py check                              # notebooks match their sources?
    python chapters/book.py source 08_codegen                  # .ipynb -> .py (edited in Lab)
    python chapters/book.py times                              # the slowest cells of each run

A source cell starts with `# %%` (code) or `# %% [markdown]`, followed by its metadata; `id` is the
notebook cell's id, kept stable so tests and nbgrader can name cells (`id="sched-19"`). Magics are
written commented out (`# %load_ext tinyteach`) so that the source is plain Python for ruff.
The stored outputs live only in the .ipynb; nbval compares a re-run with them.
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
from datetime import datetime
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient

CHAPTERS = Path(__file__).resolve().parent
SOURCES = CHAPTERS / "src"
# percent format, no YAML header: the builder writes the notebook's metadata itself
SOURCE_FORMAT = {"extension": ".py", "format_name": "percent", "notebook_metadata_filter": "-all"}
KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}
# cell metadata that execution writes (timestamps): kept in the .ipynb, never in the source
RUN_METADATA = ("execution", "collapsed", "scrolled", "trusted", "ExecuteTime")
# how jupytext records blank lines it could not infer; layout of the .py, not part of the notebook
JUPYTEXT_LAYOUT = ("lines_to_next_cell", "cell_marker")
CELL_TIMEOUT_S = 600


def chapter_names() -> list[str]:
    """Every chapter that has a source, in book order (`00_tour`, ..., `viz_demo`)."""
    return sorted(path.stem for path in SOURCES.glob("*.py"))


def notebook_from_source(name: str) -> nbformat.NotebookNode:
    """Read `src/<name>.py` into a notebook without outputs; the `id` metadata becomes cell ids."""
    path = SOURCES / f"{name}.py"
    if not path.exists():
        raise SystemExit(f"no source {path}; chapters with sources: {', '.join(chapter_names())}")
    notebook = jupytext.read(path, fmt=SOURCE_FORMAT)
    for index, cell in enumerate(notebook.cells):
        for key in JUPYTEXT_LAYOUT:
            cell.metadata.pop(key, None)
        cell_id = cell.metadata.pop("id", None)
        if not cell_id:
            raise SystemExit(f"{path}: cell {index + 1} has no id (write `# %% id=\"...\"`)")
        cell.id = cell_id
    ids = [cell.id for cell in notebook.cells]
    duplicates = sorted({cell_id for cell_id in ids if ids.count(cell_id) > 1})
    if duplicates:
        raise SystemExit(f"{path}: cell ids used twice: {', '.join(duplicates)}")
    notebook.nbformat, notebook.nbformat_minor = 4, 5
    notebook.metadata = {"kernelspec": dict(KERNELSPEC),
                         "language_info": {"name": "python", "pygments_lexer": "ipython3"}}
    nbformat.validate(notebook)
    return notebook


def source_from_notebook(notebook: nbformat.NotebookNode) -> str:
    """A notebook as percent-format text: each cell's id goes into its metadata, outputs go."""
    notebook = copy.deepcopy(notebook)
    for cell in notebook.cells:
        kept = {key: value for key, value in cell.metadata.items() if key not in RUN_METADATA}
        cell.metadata = {"id": cell.id, **kept}
    return jupytext.writes(notebook, fmt=SOURCE_FORMAT)


def cell_view(cell: nbformat.NotebookNode) -> dict:
    """What a source determines about a cell: id, type, source and metadata (not its outputs)."""
    metadata = {key: value for key, value in cell.metadata.items() if key not in RUN_METADATA}
    return {"id": cell.id, "cell_type": cell.cell_type, "source": cell.source,
            "metadata": metadata}


def differences(name: str) -> list[str]:
    """Where `<name>.ipynb` and `src/<name>.py` disagree, one line each (empty when they agree)."""
    path = CHAPTERS / f"{name}.ipynb"
    if not path.exists():
        return [f"{path.name} is missing: run `make chapter NB={name}`"]
    built = [cell_view(cell) for cell in notebook_from_source(name).cells]
    stored = [cell_view(cell) for cell in nbformat.read(path, as_version=4).cells]
    if [cell["id"] for cell in built] != [cell["id"] for cell in stored]:
        return [f"{name}: cell ids differ: source {[c['id'] for c in built]}, "
                f"notebook {[c['id'] for c in stored]}"]
    found = []
    for from_source, from_notebook in zip(built, stored):
        for field in ("cell_type", "source", "metadata"):
            if from_source[field] != from_notebook[field]:
                found.append(f"{name} cell {from_source['id']}: {field} differs")
    return found


def execute(notebook: nbformat.NotebookNode) -> None:
    """Run every cell in a fresh kernel started in chapters/, as nbval and JupyterLab do."""
    client = NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(CHAPTERS)}})
    client.execute()


def keep_outputs(notebook: nbformat.NotebookNode, name: str) -> None:
    """Copy the stored outputs of `<name>.ipynb` onto the code cells with the same id.

    For edits that change no output (prose, comments, imports): nbval, in `make test`, still
    re-runs every cell and fails where a kept output is no longer what the code prints."""
    stored_notebook = nbformat.read(CHAPTERS / f"{name}.ipynb", 4)
    notebook.metadata = stored_notebook.metadata  # with the widget state of the run kept
    stored = {cell.id: cell for cell in stored_notebook.cells}
    for cell in notebook.cells:
        old = stored.get(cell.id)
        if cell.cell_type == "code" and old is not None and old.cell_type == "code":
            cell.outputs, cell.execution_count = old.outputs, old.execution_count
            cell.metadata.update({k: v for k, v in old.metadata.items() if k in RUN_METADATA})
            if old.source != cell.source:
                print(f"  {cell.id}: source changed, output kept (nbval will check it)")


def build(name: str, run: bool = True, kept: bool = False) -> None:
    """Rebuild `<name>.ipynb` from its source and (by default) execute it; written on success."""
    notebook = notebook_from_source(name)
    if kept:
        keep_outputs(notebook, name)
    elif run:
        if "CPU_VECTOR_WIDTH" not in os.environ:
            raise SystemExit("the book's outputs are a 16-lane CPU's: run `make chapter NB=...`, "
                             "or set CPU_VECTOR_WIDTH=16")
        execute(notebook)
    nbformat.validate(notebook)
    nbformat.write(notebook, CHAPTERS / f"{name}.ipynb")
    print(f"wrote chapters/{name}.ipynb")


def write_source(name: str) -> None:
    """Write `src/<name>.py` from `<name>.ipynb` (for a chapter edited in JupyterLab)."""
    notebook = nbformat.read(CHAPTERS / f"{name}.ipynb", as_version=4)
    SOURCES.mkdir(exist_ok=True)
    (SOURCES / f"{name}.py").write_text(source_from_notebook(notebook))
    print(f"wrote chapters/src/{name}.py")


def cell_seconds(cell: nbformat.NotebookNode) -> float:
    """How long a cell of an executed notebook ran, from the timestamps nbclient records."""
    run = cell.metadata.get("execution", {})
    if "iopub.execute_input" not in run:
        return 0.0
    start = datetime.fromisoformat(run["iopub.execute_input"].rstrip("Z"))
    end = datetime.fromisoformat(run["shell.execute_reply"].rstrip("Z"))
    return (end - start).total_seconds()


def report_times(name: str, slowest: int = 5) -> None:
    """One line: the seconds the last run of `<name>.ipynb` spent in cells, and the slowest."""
    cells = nbformat.read(CHAPTERS / f"{name}.ipynb", as_version=4).cells
    times = sorted(((cell_seconds(cell), cell.id) for cell in cells), reverse=True)
    top = ", ".join(f"{cell_id} {seconds:.1f} s" for seconds, cell_id in times[:slowest])
    print(f"{name}: {sum(seconds for seconds, _ in times):.1f} s in cells; slowest: {top}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["build", "check", "source", "times"])
    parser.add_argument("names", nargs="*", help="chapters, e.g. 08_codegen (default: all)")
    parser.add_argument("--all", action="store_true", help="every chapter with a source")
    parser.add_argument("--no-execute", action="store_true", help="build without running")
    parser.add_argument("--keep-outputs", action="store_true",
                        help="do not run; keep the stored outputs of cells with the same id")
    args = parser.parse_intermixed_args(argv)
    names = [Path(name).stem for name in args.names] or chapter_names()
    if args.command == "build":
        if not args.names and not args.all:
            parser.error("name the chapters to build, or pass --all")
        for name in names:
            build(name, run=not args.no_execute, kept=args.keep_outputs)
    elif args.command == "source":
        for name in names:
            write_source(name)
    elif args.command == "times":
        for name in names:
            report_times(name)
    else:
        problems = [line for name in names for line in differences(name)]
        print("\n".join(problems) or f"{len(names)} notebooks match their sources")
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
