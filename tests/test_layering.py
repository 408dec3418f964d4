"""The layering of DESIGN.md, checked on the source: each module imports only modules at or below
its own layer (the order in tinyteach/__init__.py's docstring), nothing under tinyteach/ imports
the visual layer or Jupyter, and every module has a docstring."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import tinyteach
from tinyteach.tensor_core import CoreTensor

PACKAGE = Path(tinyteach.__file__).parent

# bottom to top, as tinyteach/__init__.py states it; settings.py (every setting) is the bottom,
# importing nothing of tinyteach, with chapters.py (the chapter table) beside it, and helpers.py
# re-exports its tinygrad names; opt.py is chapter 7's optimizer (with lower), wmma.py chapter
# 8b's tensor cores (with lower, which calls it), transcendental.py exp2 from primitive ops
# (with lower: it rewrites a linear program; render/c.py calls it), search.py its timed search
# and pack.py its packing copies (with realize, which calls both); the parts of Tensor
# (TENSOR_PARTS below) are one layer, ordered within it
CORE = ["settings", "helpers", "dtype", "uop", "view", "rewrite", "device", "schedule", "lower",
        "render", "runtime", "realize", "gradient", "tensor", "indexing"]
SAME_LAYER = {"chapters": "settings",
              "opt": "lower", "plan": "lower", "wmma": "lower", "transcendental": "lower",
              "search": "realize", "pack": "realize",
              "tensor_core": "tensor", "multi": "tensor",
              "tensor_create": "tensor", "tensor_movement": "tensor", "tensor_math": "tensor",
              "tensor_nn": "tensor", "indexing": "tensor"}
TOP = ["jit", "nn", "exercises"]  # may import anything below them
LAYERS = CORE + TOP
FORBIDDEN = {"viz", "IPython", "ipywidgets", "graphviz", "ipykernel", "notebook", "jupyter"}
# the parts of Tensor, bottom to top: each is a mixin on the one before it, and tensor.py, which
# assembles them, is the top. A part imports only parts below it, never inside a function
TENSOR_PARTS = ["tensor_core", "tensor_create", "tensor_movement", "tensor_math", "tensor_nn",
                "indexing", "tensor"]
TENSOR_CLASSES = ["CoreTensor", "TensorCreation", "TensorMovement", "TensorMath", "TensorNN",
                  "TensorIndexing", "Tensor"]


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def layer_name(path: Path) -> str:
    """tinyteach/render/c.py -> 'render'; tinyteach/uop.py -> 'uop'."""
    first = path.relative_to(PACKAGE).parts[0]
    name = first[:-3] if first.endswith(".py") else first
    return SAME_LAYER.get(name, name)


def level(name: str) -> int:
    return LAYERS.index(SAME_LAYER.get(name, name))


def imports_of(path: Path) -> list[tuple[str, bool]]:
    """(module name, imported inside a function?) for every import in the file."""
    tree = ast.parse(path.read_text())
    found = []
    in_function = {id(n) for f in ast.walk(tree)
                   if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for n in ast.walk(f)}
    for node in ast.walk(tree):
        lazy = id(node) in in_function
        if isinstance(node, ast.Import):
            found += [(alias.name, lazy) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import: resolve against the file's package
                package = path.relative_to(PACKAGE.parent).with_suffix("").parts[:-node.level]
                base = ".".join(package)
                found.append((f"{base}.{node.module}" if node.module else base, lazy))
                found += [(f"{base}.{alias.name}", lazy) for alias in node.names
                          if not node.module]
            else:
                found.append((node.module or "", lazy))
    return found


def test_every_module_has_a_known_layer():
    unknown = sorted({layer_name(p) for p in modules() if layer_name(p) != "__init__"} -
                     set(LAYERS))
    assert unknown == [], f"add {unknown} to the layer order (tinyteach/__init__.py and here)"


def test_the_order_matches_the_package_docstring():
    doc = " ".join((tinyteach.__doc__ or "").split())
    stated = "settings, helpers, dtype, uop, view, rewrite, device, schedule, lower, render, " \
             "runtime, realize, gradient, the tensor layer"
    assert stated in doc
    assert stated.split(", ")[:-1] + ["tensor", "indexing"] == CORE
    assert all(part in doc for part in TENSOR_PARTS) and "tensor.py on top" in doc


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down(path):
    if path == PACKAGE / "__init__.py":
        return  # the package entry point re-exports the public API from every layer
    own = layer_name(path)
    upward = []
    for module, _inside_a_function in imports_of(path):
        parts = module.split(".")
        if parts[0] != "tinyteach" or len(parts) < 2:
            continue
        target = SAME_LAYER.get(parts[1], parts[1])
        if target not in LAYERS:
            upward.append(f"{module} (unknown layer)")
        elif level(target) > level(own):
            upward.append(module)
    assert upward == [], f"{own} must not import modules above it: {upward}"


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_visual_layer_or_jupyter_imports(path):
    # the one bridge (DESIGN.md): `%load_ext tinyteach` runs tinyteach.load_ipython_extension,
    # which imports viz lazily, inside the function, only when IPython asks for it
    bridge = path == PACKAGE / "__init__.py"
    bad = [m for m, lazy in imports_of(path)
           if m.split(".")[0] in FORBIDDEN and not (bridge and lazy)]
    assert bad == [], f"{path.name} imports {bad}: the core stays free of viz and Jupyter"


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_every_module_has_a_docstring(path):
    docstring = ast.get_docstring(ast.parse(path.read_text()))
    assert docstring and docstring.strip(), f"{path} has no module docstring"


@pytest.mark.parametrize("name", ["settings", "chapters"])
def test_the_bottom_imports_nothing_of_tinyteach(name):
    # the bottom layer: every other module may read a setting, so it reads none of them
    found = [module for module, _ in imports_of(PACKAGE / f"{name}.py")
             if module.split(".")[0] == "tinyteach"]
    assert found == [] and level(name) == 0


def test_the_checker_catches_an_upward_import(tmp_path):
    # the test can fail: a fake uop.py that imports the tensor layer is flagged
    fake = PACKAGE / "uop.py"
    source = "import tinyteach.tensor\ndef f():\n    from tinyteach.schedule import x\n"
    path = tmp_path / "uop.py"
    path.write_text(source)
    found = imports_of(path)
    assert ("tinyteach.tensor", False) in found and ("tinyteach.schedule", True) in found
    assert level("tensor") > level(layer_name(fake))


# ---- inside the tensor layer: each part of Tensor stands on the parts below it ----

@pytest.mark.parametrize("name", TENSOR_PARTS)
def test_each_tensor_part_imports_only_parts_below_it(name):
    below = TENSOR_PARTS[:TENSOR_PARTS.index(name)]
    wrong = []
    for module, lazy in imports_of(PACKAGE / f"{name}.py"):
        parts = module.split(".")
        if parts[0] == "tinyteach" and len(parts) > 1 and parts[1] in TENSOR_PARTS:
            if parts[1] not in below or lazy:
                wrong.append(f"{module}{' (inside a function)' if lazy else ''}")
    assert wrong == [], f"{name} may import only {below} (at the top of the file): {wrong}"


def part_classes() -> list[type]:
    return [getattr(importlib.import_module(f"tinyteach.{module}"), name)
            for module, name in zip(TENSOR_PARTS, TENSOR_CLASSES)]


def test_each_part_is_a_mixin_on_the_one_below():
    classes = part_classes()
    for lower, upper in zip(classes, classes[1:]):
        assert upper.__bases__ == (lower,), f"{upper.__name__} must inherit {lower.__name__} only"
    assert classes[-1].__mro__[:len(classes)] == tuple(reversed(classes))
    # Tensor itself defines nothing (setting the switches Tensor.no_grad or Tensor.training
    # puts them on the class, which is how they work)
    assert vars(classes[-1]).keys() <= {"__module__", "__doc__", "__qualname__",
                                        "__firstlineno__", "__static_attributes__",
                                        "no_grad", "training"}


# what CoreTensor.__init__ sets on every tensor
INSTANCE_FIELDS = {"uop", "device", "grad", "_lazy", "_requires_grad"}


def names_used_on_self(function: ast.FunctionDef) -> set[str]:
    """The attributes a method reads on `self`, `cls` or `type(self)`."""
    owners = {"self", "cls"}
    used = set()
    for node in ast.walk(function):
        if not isinstance(node, ast.Attribute):
            continue
        value = node.value
        if isinstance(value, ast.Name) and value.id in owners:
            used.add(node.attr)
        elif isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and \
                value.func.id == "type" and len(value.args) == 1 and \
                isinstance(value.args[0], ast.Name) and value.args[0].id == "self":
            used.add(node.attr)
    return used


def unknown_names(cls: type, source: str) -> list[str]:
    """Names a class's methods use on self that neither it nor a class below it defines."""
    tree = ast.parse(source)
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    unknown = []
    for method in body.body:
        if isinstance(method, ast.FunctionDef):
            for name in sorted(names_used_on_self(method)):
                if not hasattr(cls, name) and name not in INSTANCE_FIELDS:
                    unknown.append(f"{method.name} uses {name}")
    return unknown


@pytest.mark.parametrize("index", range(len(TENSOR_PARTS) - 1), ids=TENSOR_PARTS[:-1])
def test_each_part_uses_only_what_is_below_it(index):
    cls = part_classes()[index]
    source = (PACKAGE / f"{TENSOR_PARTS[index]}.py").read_text()
    assert unknown_names(cls, source) == []


def test_the_part_checker_catches_a_method_from_above():
    # the test can fail: a method of the core that calls softmax (tensor_nn.py) is flagged
    source = ("class CoreTensor:\n    def f(self):\n"
              "        return self.softmax() + type(self).ones(1)\n")
    assert unknown_names(CoreTensor, source) == ["f uses ones", "f uses softmax"]
