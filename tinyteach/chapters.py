"""The book's table of contents: each chapter, its notebook and the modules it teaches.

This is the one chapter -> module map. The README's chapter map, the table in
tinyteach/__init__.py's docstring and every module's first docstring line ("Chapter 7 (part 2):
...") are checked against it by tests/test_chapter_map.py, so the three cannot drift apart.

- `modules`: the files (or whole folders, written with a trailing "/") a chapter teaches. Each
  module of tinyteach/ belongs to exactly one chapter; where a folder and a file inside it sit in
  different chapters, the file wins (runtime/ is chapter 9, runtime/python.py chapter 8b).
- `also`: modules a chapter reads again that another chapter owns (8b the GPU actions of opt/).
- Paths are relative to tinyteach/, except viz/..., the visual layer at the repository's top.
- INFRASTRUCTURE: modules no chapter teaches, which every chapter uses.

>>> chapter_of("runtime/python.py").title
'GPU kernels: threads, work-groups and shared memory'
>>> chapter_of("render/c.py").id, chapter_of("settings.py")
('8', None)
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Chapter:
    id: str  # "8b": the number printed in the book
    title: str  # as the notebook's first heading writes it
    notebook: str  # relative to the repository's top
    modules: tuple[str, ...]
    also: tuple[str, ...] = ()


CHAPTERS: tuple[Chapter, ...] = (
    Chapter("0", "A tour: the whole stack from the top", "chapters/00_tour.ipynb", ()),
    Chapter("1", "Tensors: a PyTorch-like API from 29 primitive ops", "chapters/01_tensors.ipynb",
            ("tensor/", "dtype.py")),
    Chapter("2", "Autograd: reverse mode on the graph", "chapters/02_autograd.ipynb",
            ("tensor/gradient.py",)),
    Chapter("3", "The IR: UOps and the primitive op set", "chapters/03_ir.ipynb",
            ("ir/uop.py",)),
    Chapter("4", "Shapes without copies: views", "chapters/04_views.ipynb", ("ir/view.py",)),
    Chapter("4b", "Symbolic shapes: one kernel for every length", "chapters/04b_symbolic.ipynb",
            (), also=("ir/uop.py", "ir/view.py")),
    Chapter("5", "Rewriting graphs: the pattern matcher", "chapters/05_rewrite.ipynb",
            ("ir/rewrite.py",)),
    Chapter("6", "Scheduling: kernel fusion", "chapters/06_scheduling.ipynb",
            ("engine/schedule.py",)),
    Chapter("7", "Lowering and the optimization space: actions and BEAM",
            "chapters/07_lowering.ipynb", ("codegen/lower.py", "codegen/plan.py", "opt/")),
    Chapter("8", "Code generation: C, OpenCL, CUDA, WGSL", "chapters/08_codegen.ipynb",
            ("render/", "codegen/transcendental.py")),
    Chapter("8b", "GPU kernels: threads, work-groups and shared memory", "chapters/08b_gpu.ipynb",
            ("codegen/lower_gpu.py", "codegen/wmma.py", "runtime/python.py", "viz/threads.py"),
            also=("opt/",)),
    Chapter("8c", "GPU puzzles: kernels graded by the emulator",
            "chapters/08c_gpu_puzzles.ipynb", ("exercises/gpu_puzzles.py",),
            also=("runtime/python.py",)),
    Chapter("9", "Devices and runtimes", "chapters/09_devices.ipynb",
            ("device.py", "engine/realize.py", "runtime/", "tensor/multi.py")),
    Chapter("10", "The JIT and graph execution", "chapters/10_jit.ipynb", ("engine/jit.py",)),
    Chapter("11", "Deep learning: nn, optim, state, datasets",
            "chapters/11_deep_learning.ipynb", ("nn/",)),
    Chapter("11b", "Attention and a small GPT", "chapters/11b_gpt.ipynb",
            ("nn/transformer.py",)),
    Chapter("12", "Exercise: build a backend", "chapters/12_exercise_backend.ipynb",
            ("exercises/",)),
)

# every chapter uses these; none teaches them. settings.py lists the settings of every chapter
# (the README's Settings section is its reader's view), so it has no one chapter either; the
# __init__.py of ir/, engine/ and codegen/ is a guide to its folder, whose modules sit in
# different chapters
INFRASTRUCTURE: tuple[str, ...] = ("__init__.py", "chapters.py", "helpers.py", "settings.py",
                                   "ir/__init__.py", "engine/__init__.py", "codegen/__init__.py")


def chapter_of(module: str) -> Chapter | None:
    """The chapter that teaches `module` ("ir/uop.py", "render/c.py"): the most specific entry wins,
    so a file named on its own beats the folder it sits in. None for INFRASTRUCTURE."""
    best: tuple[int, Chapter] | None = None
    for chapter in CHAPTERS:
        for entry in chapter.modules:
            covers = module.startswith(entry) if entry.endswith("/") else module == entry
            if covers and (best is None or len(entry) > best[0]):
                best = (len(entry), chapter)
    if best is None and module not in INFRASTRUCTURE:
        raise KeyError(f"{module!r} is in no chapter and not infrastructure: add it to CHAPTERS")
    return best[1] if best else None
