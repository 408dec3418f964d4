"""Claims the book's chapters make about the library, checked against the library (issue 17), so
that a change to tinyteach that makes a chapter's text false fails here, with the cell named."""
from __future__ import annotations

import importlib.util
import inspect
import json
import math
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tinyteach import Tensor, dtypes, nn
from tinyteach.engine import schedule
from tinyteach.ir.rewrite import PatternMatcher, graph_rewrite, symbolic
from tinyteach.ir.uop import PRIMITIVE_OPS, Ops, UOp
from tinyteach.runtime import cpu
from tinyteach.runtime.numpy import NUMPY_OPS

CHAPTERS = Path(__file__).resolve().parent.parent / "chapters"


def load_builder():
    """chapters/book.py, the book's builder (a script beside the chapters, not a package)."""
    spec = importlib.util.spec_from_file_location("book", CHAPTERS / "book.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


book = load_builder()


def cell_source(notebook: str, cell_id: str) -> str:
    cells = json.loads((CHAPTERS / notebook).read_text())["cells"]
    return "".join(next(cell["source"] for cell in cells if cell["id"] == cell_id))


def code_cells(notebook: str) -> list[str]:
    cells = json.loads((CHAPTERS / notebook).read_text())["cells"]
    return ["".join(cell["source"]) for cell in cells if cell["cell_type"] == "code"]


def test_kaiming_uniform_takes_the_fan_in_from_shape_1():
    """00 tour-03: kaiming_uniform's fan-in is shape[1:], nn.Linear's (out, in) layout."""
    Tensor.manual_seed(0)
    bound = math.sqrt(3.0) * math.sqrt(2.0 / (1 + 0.01 ** 2)) / math.sqrt(784)
    weights = Tensor.kaiming_uniform(128, 784, device="NUMPY").numpy()
    assert np.abs(weights).max() <= bound and np.abs(weights).max() > 0.99 * bound
    assert "kaiming_uniform(128, 784).T" in cell_source("00_tour.ipynb", "tour-04")


def _range(name: str, size: int) -> UOp:
    return UOp(Ops.RANGE, dtypes.int32, (), (name, 0, size))


def test_symbolic_alone_does_not_recombine_after_the_mod_rule():
    """05 rewrite-22/rewrite-34: the MOD rule rewrites x%4's operand first, so recombine_divmod
    misses (x//4)*4 + x%4; a recombining pass run first finds it. If symbolic learns to do it
    alone, chapter 5's section on rule order needs a new example."""
    x = _range("r", 2) * 6 + _range("g", 6)
    expression = (x // 4) * 4 + x % 4
    assert graph_rewrite(expression, symbolic) is not x
    recombine = PatternMatcher("recombine", [rule for rule in symbolic.rules
                                             if rule[0] == "(x//c)*c + x%c -> x"])
    assert graph_rewrite(graph_rewrite(expression, recombine), symbolic) is x


def test_chapter_6_lists_the_schedulers_limits_and_reasons():
    """06 sched-19: the table names the limits with their values, and every reason
    find_realized gives."""
    table = cell_source("06_scheduling.ipynb", "sched-19")
    assert f"broadcast {schedule.BROADCAST_RECOMPUTE_LIMIT}×" in table
    assert f"{schedule.MAX_KERNEL_DEPTH:,} deep" in table
    assert f"{schedule.MAX_VIEWS_PER_NODE} different views" in table
    source = inspect.getsource(schedule)
    reasons = re.findall(r'"(it is an output|contiguous\(\) asks|a copy between devices|'
                         r'assign\(\) writes|the reduction feeds another|'
                         r"the reduction's result is padded)", source)
    assert len(set(reasons)) == 6
    for words in ("it is an output", "contiguous()", "a copy between devices", "assign()",
                  "feeds another reduction", "padded", "broadcast back", "several kernels",
                  "1,000 deep"):
        assert words in table, words


def test_the_numpy_table_lacks_exactly_buffer_and_copy():
    """09 dev-21: 27 numpy functions for 29 primitive ops; BUFFER and COPY compute nothing."""
    assert {op for op in PRIMITIVE_OPS if op not in NUMPY_OPS} == {Ops.BUFFER, Ops.COPY}


def test_gradients_do_not_depend_on_training_mode_but_step_does():
    """11 dl-37: backward() gives the same gradient in and out of training mode; step() needs it."""
    grads = []
    for training in (False, True):
        weight = Tensor([2.0, -1.0], requires_grad=True, device="NUMPY")
        with Tensor.train(training):
            ((weight - 3) ** 2).sum().backward()
        grads.append(weight.grad.numpy())
    np.testing.assert_array_equal(grads[0], grads[1])
    with pytest.raises(RuntimeError, match="training mode"):
        nn.optim.SGD([weight], lr=0.1).step()


def test_the_cpu_device_compiles_with_fwrapv():
    """12 ex-a-rules: -fwrapv is what makes signed overflow wrap in the C backend."""
    assert "-fwrapv" in cpu.C_FLAGS
    assert "-fwrapv" in cell_source("12_exercise_backend.ipynb", "ex-a-rules")


def course_commands(course: Path) -> tuple[str, str]:
    """`make course`'s recipe for the folder `course`, as make would run it (`make -n`): the
    shell lines that fill the folder, and the whole recipe."""
    recipe = subprocess.run(["make", "-n", "course", f"COURSE={course}"], cwd=CHAPTERS.parent,
                            capture_output=True, text=True, check=True).stdout
    lines = recipe.splitlines()
    start = lines.index(f"mkdir -p {course}")
    end = next(k for k in range(start, len(lines)) if lines[k].endswith("done"))
    return "\n".join(lines[start:end + 1]), recipe


def test_make_course_serves_the_student_copy_of_the_exercise(tmp_path):
    """`make course` serves course/: every chapter, with the exercise's student copy in place of
    the solved notebook, so no notebook it serves holds a solution (issue 27); and a notebook
    already there (the student's work) is kept."""
    from tinyteach.exercises.student_version import has_solution
    fill, recipe = course_commands(tmp_path)
    assert f"--notebook-dir={tmp_path} " in recipe
    subprocess.run(["bash", "-c", fill], cwd=CHAPTERS.parent, check=True)
    served = sorted(path.name for path in tmp_path.glob("*.ipynb"))
    assert served == sorted(path.name for path in CHAPTERS.glob("*.ipynb"))
    for path in tmp_path.glob("*.ipynb"):
        cells = json.loads(path.read_text())["cells"]
        assert not any(has_solution(cell) for cell in cells), path.name
    exercise = (tmp_path / "12_exercise_backend.ipynb").read_text()
    assert "raise NotImplementedError()" in exercise
    assert any(has_solution(cell) for cell in
               json.loads((CHAPTERS / "12_exercise_backend.ipynb").read_text())["cells"])
    (tmp_path / "12_exercise_backend.ipynb").write_text("the student's work")
    subprocess.run(["bash", "-c", fill], cwd=CHAPTERS.parent, check=True)
    assert (tmp_path / "12_exercise_backend.ipynb").read_text() == "the student's work"


@pytest.mark.parametrize("notebook", sorted(path.name for path in CHAPTERS.glob("*.ipynb")))
def test_every_chapter_pins_its_device_and_seeds(notebook: str):
    """Stored outputs must not depend on the devices present or on a random seed."""
    setup = "\n".join(code_cells(notebook)[:3])
    if notebook.startswith("12_"):
        pytest.skip("the exercise chooses its devices itself (its grader pins them)")
    assert re.search(r'Device\.DEFAULT = "CPU"', setup), notebook
    assert "Tensor.manual_seed(0)" in setup, notebook


# ---- the book's sources: chapters/src/NN_name.py generates chapters/NN_name.ipynb -------------

NOTEBOOKS = sorted(path.stem for path in CHAPTERS.glob("*.ipynb"))


def test_every_notebook_has_a_source_and_every_source_a_notebook():
    assert NOTEBOOKS == book.chapter_names()


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_the_notebook_matches_its_source(name: str):
    """Cells, ids, sources and metadata of the .ipynb are what src/<name>.py builds: edit the
    source and run `make chapter NB=<name>` (chapters/src/README.md)."""
    assert book.differences(name) == []


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_code_cells_keep_lines_under_100_characters(name: str):
    """Code lines stay within 100 characters (ruff's E501 is off for the sources' prose)."""
    long_lines = [line for source in code_cells(f"{name}.ipynb") for line in source.splitlines()
                  if len(line) > 100]
    assert long_lines == []


def write_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    sources = tmp_path / "src"
    sources.mkdir()
    (sources / "99_test.py").write_text(text)
    monkeypatch.setattr(book, "SOURCES", sources)
    monkeypatch.setattr(book, "CHAPTERS", tmp_path)


def test_a_source_round_trips_through_the_notebook(tmp_path, monkeypatch):
    text = (
        '# %% [markdown] id="t-01"\n# # A title\n\n'
        '# %% id="t-02"\n# %load_ext tinyteach\nx = 1\n\n'
        '# %% id="t-03" jupyter={"source_hidden": true} tags=["solution"]\nx + 1\n'
    )
    write_source(tmp_path, monkeypatch, text)
    notebook = book.notebook_from_source("99_test")
    assert [cell.id for cell in notebook.cells] == ["t-01", "t-02", "t-03"]
    assert [cell.cell_type for cell in notebook.cells] == ["markdown", "code", "code"]
    assert notebook.cells[1].source == "%load_ext tinyteach\nx = 1"  # the magic is back
    assert notebook.cells[2].metadata == {"jupyter": {"source_hidden": True},
                                          "tags": ["solution"]}
    assert book.source_from_notebook(notebook) == text


def test_a_changed_source_is_reported_by_cell(tmp_path, monkeypatch):
    write_source(tmp_path, monkeypatch, '# %% id="t-01"\nx = 1\n')
    book.build("99_test", run=False)
    assert book.differences("99_test") == []
    (tmp_path / "src" / "99_test.py").write_text('# %% id="t-01"\nx = 2\n')
    assert book.differences("99_test") == ["99_test cell t-01: source differs"]
    (tmp_path / "src" / "99_test.py").write_text('# %% id="t-01"\nx = 2\n\n# %% id="t-02"\n')
    assert "cell ids differ" in book.differences("99_test")[0]


@pytest.mark.parametrize("text, message", [
    ('# %% id="t-01"\nx = 1\n\n# %%\ny = 2\n', "cell 2 has no id"),
    ('# %% id="t-01"\nx = 1\n\n# %% id="t-01"\ny = 2\n', "cell ids used twice: t-01"),
])
def test_a_source_without_stable_ids_is_refused(tmp_path, monkeypatch, text, message):
    write_source(tmp_path, monkeypatch, text)
    with pytest.raises(SystemExit, match=message):
        book.notebook_from_source("99_test")


def test_a_build_runs_the_cells_in_chapters_with_the_books_vector_width(tmp_path, monkeypatch):
    write_source(tmp_path, monkeypatch, '# %% id="t-01"\nimport os\n\n'
                 'print(os.environ["CPU_VECTOR_WIDTH"], os.getcwd())\n')
    monkeypatch.setenv("CPU_VECTOR_WIDTH", "16")
    book.build("99_test")
    cell = json.loads((tmp_path / "99_test.ipynb").read_text())["cells"][0]
    assert cell["id"] == "t-01"
    assert "".join(cell["outputs"][0]["text"]) == f"16 {tmp_path}\n"
    monkeypatch.delenv("CPU_VECTOR_WIDTH")
    with pytest.raises(SystemExit, match="16-lane CPU"):
        book.build("99_test")


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_nbval_markers_are_written_as_nbval_reads_them(name: str):
    """nbval acts on a comment only when it is exactly a marker: `# NBVAL_IGNORE_OUTPUT: why`
    is silently an ordinary comment. The reason goes on the next line."""
    from nbval.plugin import comment_markers
    comments = [line.strip().lstrip("#").strip() for source in code_cells(f"{name}.ipynb")
                for line in source.splitlines() if line.strip().startswith("#")]
    misspelt = [comment for comment in comments
                if comment.startswith("NBVAL") and comment not in comment_markers]
    assert misspelt == []
