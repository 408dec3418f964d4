"""The one chapter -> module table (tinyteach/chapters.py) against everything that restates it:
the files on disk (both ways), each notebook's first heading, every module's first docstring line,
the README's chapter map and the table in tinyteach/__init__.py's docstring. Each check returns
its problems as a list, and the self-checks at the bottom feed it a wrong entry, so it can fail."""
from __future__ import annotations

import ast
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

import tinyteach
from tinyteach.chapters import CHAPTERS, INFRASTRUCTURE, Chapter, chapter_of

PACKAGE = Path(tinyteach.__file__).parent
ROOT = PACKAGE.parent
# "Chapter 7 (part 2): ...", "Chapter 12 (exercise A): ...", "Chapter 9: ..."
HEADER = re.compile(r"Chapter (\w+)(?: \(([^()]*)\))?: \S")
Row = tuple[str, str, str | None, tuple[str, ...], tuple[str, ...]]  # id, title, notebook, ...


def package_modules() -> list[str]:
    """Every module of tinyteach/, as the table writes it: 'ir/uop.py', 'render/c.py'."""
    return sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                  if "__pycache__" not in p.parts)


def source_of(entry: str) -> Path:
    """Where a table entry lives: viz/... at the repository's top, the rest in tinyteach/."""
    return ROOT / entry if entry.startswith("viz/") else PACKAGE / entry


def covering(chapters: tuple[Chapter, ...], module: str) -> list[tuple[str, str]]:
    """(chapter id, entry) for every entry that names `module` or a folder above it."""
    return [(chapter.id, entry) for chapter in chapters for entry in chapter.modules
            if (module.startswith(entry) if entry.endswith("/") else module == entry)]


def ownership_problems(chapters: tuple[Chapter, ...], infrastructure: tuple[str, ...],
                       modules: list[str]) -> list[str]:
    """Every module in exactly one chapter (the most specific entry) or infrastructure; every
    entry names something that exists."""
    problems = []
    for module in modules:
        found = covering(chapters, module)
        if module in infrastructure:
            if found:
                problems.append(f"{module} is infrastructure and also in {found}")
            continue
        if not found:
            problems.append(f"{module} is in no chapter and not infrastructure")
            continue
        longest = max(len(entry) for _, entry in found)
        owners = [(cid, entry) for cid, entry in found if len(entry) == longest]
        if len(owners) > 1:
            problems.append(f"{module} is claimed by {owners}")
        same_chapter = [cid for cid, _ in found]
        if len(set(same_chapter)) < len(same_chapter):
            problems.append(f"{module} is listed twice in one chapter: {found}")
    for chapter in chapters:
        for entry in (*chapter.modules, *chapter.also):
            path = source_of(entry)
            if not (path.is_dir() if entry.endswith("/") else path.is_file()):
                problems.append(f"chapter {chapter.id}: {entry} does not exist")
        for entry in chapter.also:
            owner = [cid for cid, _ in covering(chapters, entry)]
            if owner in ([], [chapter.id]):
                problems.append(f"chapter {chapter.id} also reads {entry}, which no other "
                                "chapter teaches")
    problems += [f"infrastructure {name} does not exist" for name in infrastructure
                 if name not in modules]
    return problems


def test_every_module_has_one_chapter_and_every_entry_exists():
    assert ownership_problems(CHAPTERS, INFRASTRUCTURE, package_modules()) == []


def test_chapter_of_agrees_with_the_entries():
    for module in package_modules():
        chapter = chapter_of(module)
        if module in INFRASTRUCTURE:
            assert chapter is None
        else:
            assert chapter is not None
            found = covering(CHAPTERS, module)
            assert (chapter.id, max((e for _, e in found), key=len)) in found
    with pytest.raises(KeyError, match="no chapter"):
        chapter_of("no_such_module.py")


def test_chapters_are_in_book_order_and_their_notebooks_exist():
    ids = [chapter.id for chapter in CHAPTERS]
    assert ids == ["0", "1", "2", "3", "4", "4b", "5", "6", "7", "8", "8b", "8c", "9", "10", "11",
                   "11b", "12"]
    on_disk = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "chapters").glob("[0-9]*.ipynb"))
    assert sorted(chapter.notebook for chapter in CHAPTERS) == on_disk
    for chapter in CHAPTERS:
        number = Path(chapter.notebook).name.split("_")[0]
        assert (number.lstrip("0") or "0") == chapter.id, chapter.notebook


def notebook_heading(notebook: Path) -> str:
    """The first line of the first markdown cell, without its '#'."""
    cells = json.loads(notebook.read_text())["cells"]
    first = next(cell for cell in cells if cell["cell_type"] == "markdown")
    return "".join(first["source"]).splitlines()[0].lstrip("# ").strip()


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.id)
def test_the_title_is_the_notebooks_heading(chapter):
    heading = notebook_heading(ROOT / chapter.notebook)
    assert heading.endswith(chapter.title), heading
    assert re.match(rf"(Chapter )?{chapter.id}\b", heading), heading


# ---- each module's first docstring line names its chapter ----

def headers() -> dict[str, str]:
    found = {}
    for module in package_modules():
        doc = ast.get_docstring(ast.parse((PACKAGE / module).read_text())) or ""
        found[module] = doc.splitlines()[0] if doc else ""
    return found


def header_problems(chapters: tuple[Chapter, ...], infrastructure: tuple[str, ...],
                    first_lines: dict[str, str]) -> list[str]:
    problems, labels = [], {}
    for module, line in first_lines.items():
        match = HEADER.match(line)
        if module in infrastructure:
            if line.startswith("Chapter"):
                problems.append(f"{module} is infrastructure, but its header says {line!r}")
            continue
        owners = covering(chapters, module)
        owner = max(owners, key=lambda found: len(found[1]))[0] if owners else None
        if match is None:
            problems.append(f"{module}: header {line!r} does not start 'Chapter {owner}: '")
        elif match.group(1) != owner:
            problems.append(f"{module} says chapter {match.group(1)}, the table {owner}")
        else:
            labels.setdefault(line.split(":")[0], []).append(module)
    problems += [f"{label!r} is the header of {names}" for label, names in labels.items()
                 if len(names) > 1]
    return problems


def test_every_header_names_its_chapter():
    assert header_problems(CHAPTERS, INFRASTRUCTURE, headers()) == []


# ---- the README's map and the package docstring's table ----

BARE_NAME = r"[\w./]+(?:\.py|/)"  # the docstring's table: ir/uop.py, render/
QUOTED_NAME = r"`([\w./]+)`"  # the README's: `ir/uop.py` (a note), `render/`


def modules_in(text: str, name: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """'`a.py` (note), `b/`; also `c.py`' -> (('a.py', 'b/'), ('c.py',))."""
    owned, also = (re.split(r";\s*also\b:?", text, maxsplit=1) + [""])[:2]
    return tuple(re.findall(name, owned)), tuple(re.findall(name, also))


def readme_rows(readme: str) -> list[Row]:
    section = readme.split("## Chapter map", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|") or cells[0] in ("#", "") or set(cells[0]) <= {"-"}:
            continue
        link = re.search(r"\]\(([^)]+)\)", cells[2])
        notebook = link.group(1) if link else None
        rows.append((cells[0], cells[1], notebook, *modules_in(cells[3], QUOTED_NAME)))
    return rows


def docstring_rows(doc: str) -> list[Row]:
    """The package docstring's table; a row with an empty first cell continues the one above."""
    merged: list[list[str]] = []
    for line in doc.splitlines():
        if not line.startswith("|"):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if cells[0] == "#" or (cells[0] and set(cells[0]) <= {"-"}):
            continue
        if cells[0]:
            merged.append(cells)
        else:
            merged[-1] = [f"{old} {new}".strip() for old, new in zip(merged[-1], cells)]
    return [(cells[0], cells[1], None, *modules_in(cells[2], BARE_NAME))
            for cells in merged]


def row_problems(chapters: tuple[Chapter, ...], rows: list[Row], where: str) -> list[str]:
    expected = [(c.id, c.title, c.notebook, c.modules, c.also) for c in chapters]
    if [row[0] for row in rows] != [row[0] for row in expected]:
        return [f"{where} lists chapters {[row[0] for row in rows]}"]
    problems = []
    for row, want in zip(rows, expected):
        if row[2] is None:  # the docstring's table names no notebook
            want = (*want[:2], None, *want[3:])
        if row != want:
            problems.append(f"{where}, chapter {row[0]}: {row} but the table says {want}")
    return problems


def test_the_readme_map_is_the_table():
    readme = (ROOT / "README.md").read_text()
    assert row_problems(CHAPTERS, readme_rows(readme), "README.md") == []
    assert all(row[2] is not None for row in readme_rows(readme))  # each row links its notebook


def test_the_package_docstring_table_is_the_table():
    rows = docstring_rows(tinyteach.__doc__ or "")
    assert row_problems(CHAPTERS, rows, "tinyteach/__init__.py") == []


def tour_rows(source: str) -> list[tuple[str, str]]:
    """(id, notebook) of each row of the tour's map (cell tour-17 of chapters/src/00_tour.py)."""
    section = source.split('id="tour-17"', 1)[1].split("# %%", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.removeprefix("#").strip().strip("|").split("|")]
        link = re.search(r"\]\(([^)]+\.ipynb)\)", line)
        if line.startswith("# |") and link and cells[0] != "#":
            rows.append((cells[0], f"chapters/{link.group(1)}"))
    return rows


def test_the_tour_map_lists_every_chapter():
    """The tour's own map (its reader's first view of the book) has a row for every chapter
    but the exercise, which its text names, in book order, each linking its notebook."""
    rows = tour_rows((ROOT / "chapters/src/00_tour.py").read_text())
    expected = [(c.id, c.notebook) for c in CHAPTERS if c.id != "12"]
    assert rows == expected


# ---- the checks can fail ----

def test_a_wrong_readme_row_is_caught():
    readme = (ROOT / "README.md").read_text()
    assert "`codegen/wmma.py`" in readme
    moved = readme.replace("`codegen/wmma.py`", "`codegen/wmma.py`, `opt/`", 1)
    assert any("chapter 8b" in problem for problem in
               row_problems(CHAPTERS, readme_rows(moved), "README.md"))
    dropped = readme.replace("`codegen/transcendental.py`", "", 1)
    assert row_problems(CHAPTERS, readme_rows(dropped), "README.md") != []


def test_a_wrong_docstring_row_is_caught():
    doc = (tinyteach.__doc__ or "").replace("| 8b |", "| 8c |", 1)
    assert row_problems(CHAPTERS, docstring_rows(doc), "x") == [
        f"x lists chapters {[c.id if c.id != '8b' else '8c' for c in CHAPTERS]}"]


def test_a_wrong_header_is_caught():
    first_lines = dict(headers())
    first_lines["codegen/wmma.py"] = "Chapter 7 (part 9): tensor cores"
    first_lines["settings.py"] = "Chapter 0: every setting"
    first_lines["ir/uop.py"] = "The IR: one node type"
    first_lines["ir/view.py"] = first_lines["ir/uop.py"].replace("The IR", "Chapter 4")
    first_lines["nn/optim.py"] = first_lines["nn/state.py"]
    problems = header_problems(CHAPTERS, INFRASTRUCTURE, first_lines)
    assert any("codegen/wmma.py says chapter 7, the table 8b" in p for p in problems)
    assert any(p.startswith("settings.py is infrastructure") for p in problems)
    assert any(p.startswith("ir/uop.py: header") for p in problems)
    assert any("is the header of ['nn/optim.py', 'nn/state.py']" in p for p in problems)
    assert len(problems) == 4  # ir/view.py's made-up header is right: chapter 4


def test_a_module_in_no_chapter_or_two_is_caught():
    by_id = {chapter.id: chapter for chapter in CHAPTERS}
    without_jit = tuple(replace(c, modules=()) if c.id == "10" else c for c in CHAPTERS)
    assert "engine/jit.py is in no chapter and not infrastructure" in \
        ownership_problems(without_jit, INFRASTRUCTURE, package_modules())
    twice = tuple(replace(c, modules=(*c.modules, "codegen/wmma.py")) if c.id == "7" else c
                  for c in CHAPTERS)
    assert any("codegen/wmma.py is claimed by" in p for p in
               ownership_problems(twice, INFRASTRUCTURE, package_modules()))
    ghost = tuple(replace(c, also=("codegen/lower.py", "gone.py")) if c is by_id["8b"] else c
                  for c in CHAPTERS)
    assert "chapter 8b: gone.py does not exist" in \
        ownership_problems(ghost, INFRASTRUCTURE, package_modules())
    assert "viz/threads.py" in by_id["8b"].modules
