"""The layering of DESIGN.md, checked on the source: each module imports only modules at or below
its own layer (the order in tinyteach/__init__.py's docstring), nothing under tinyteach/ imports
the visual layer or Jupyter, and every module has a docstring."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tinyteach

PACKAGE = Path(tinyteach.__file__).parent

# bottom to top, as tinyteach/__init__.py states it; opt.py is chapter 7's optimizer (with lower),
# search.py its timed search and pack.py its packing copies (with realize, which calls both);
# tensor_create, tensor_movement, tensor_math and tensor_nn are the parts of Tensor that tensor.py
# inherits (with tensor)
CORE = ["helpers", "dtype", "uop", "view", "rewrite", "device", "schedule", "lower", "render",
        "runtime", "realize", "gradient", "tensor", "indexing"]
SAME_LAYER = {"opt": "lower", "search": "realize", "pack": "realize", "tensor_create": "tensor",
              "tensor_movement": "tensor", "tensor_math": "tensor", "tensor_nn": "tensor"}
TOP = ["jit", "nn", "exercises"]  # may import anything below them
LAYERS = CORE + TOP
FORBIDDEN = {"viz", "IPython", "ipywidgets", "graphviz", "ipykernel", "notebook", "jupyter"}
# the tensor layer and indexing.py are one chapter split in files: each calls the other lazily
# (inside a function) at run time, which is allowed
LAZY_PAIRS = {("tensor", "indexing"), ("indexing", "tensor")}


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
    stated = "helpers, dtype, uop, view, rewrite, device, schedule, lower, render, runtime, " \
             "realize, gradient, tensor, indexing"
    assert stated in doc
    assert stated.split(", ") == CORE


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down(path):
    if path == PACKAGE / "__init__.py":
        return  # the package entry point re-exports the public API from every layer
    own = layer_name(path)
    upward = []
    for module, lazy in imports_of(path):
        parts = module.split(".")
        if parts[0] != "tinyteach" or len(parts) < 2:
            continue
        target = SAME_LAYER.get(parts[1], parts[1])
        if target not in LAYERS:
            upward.append(f"{module} (unknown layer)")
        elif level(target) > level(own) and not (lazy and (own, target) in LAZY_PAIRS):
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


def test_the_checker_catches_an_upward_import(tmp_path):
    # the test can fail: a fake uop.py that imports the tensor layer is flagged
    fake = PACKAGE / "uop.py"
    source = "import tinyteach.tensor\ndef f():\n    from tinyteach.schedule import x\n"
    path = tmp_path / "uop.py"
    path.write_text(source)
    found = imports_of(path)
    assert ("tinyteach.tensor", False) in found and ("tinyteach.schedule", True) in found
    assert level("tensor") > level(layer_name(fake))
