"""The layering of DESIGN.md, checked on the source: each module imports only modules at or below
its own layer (the order in tinyteach/__init__.py's docstring), no two modules import each other
(at the top of a file or inside a function) but for the magic's bridge, nothing under tinyteach/
imports the visual layer or Jupyter, and every module has a docstring."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import tinyteach
from tinyteach.tensor.core import CoreTensor

PACKAGE = Path(tinyteach.__file__).parent
VIZ = PACKAGE.parent / "viz"

# bottom to top, as tinyteach/__init__.py states it. A module's layer is its own name
# ("ir.uop", "engine.schedule") or its folder's ("codegen.lower" -> "codegen"), unless SAME_LAYER
# says otherwise. settings.py (every setting) is the bottom, importing nothing of tinyteach,
# with chapters.py (the chapter table) beside it; helpers.py re-exports its tinygrad names.
# codegen/ lowers a plan, opt/ builds it from actions (so it sits above codegen/, which never
# reads it); opt/search.py compiles and times kernels, so it sits with engine/realize.py, which
# calls it. tensor/ is one layer (TENSOR_PARTS below orders the parts of Tensor within it)
CORE = ["settings", "helpers", "dtype", "ir.uop", "ir.view", "ir.rewrite", "device",
        "engine.schedule", "codegen", "opt", "render", "runtime", "engine.realize", "tensor"]
SAME_LAYER = {"chapters": "settings", "ir": "ir.uop", "engine": "engine.schedule",
              "opt.search": "engine.realize"}
TOP = ["engine.jit", "nn", "exercises"]  # may import anything below them
LAYERS = CORE + TOP
FORBIDDEN = {"viz", "IPython", "ipywidgets", "graphviz", "ipykernel", "notebook", "jupyter"}
# the parts of Tensor, bottom to top: each is a mixin on the one before it, and tensor/__init__.py,
# which assembles them, is the top. A part imports only parts below it, never inside a function
TENSOR_PARTS = ["tensor.core", "tensor.create", "tensor.movement", "tensor.math", "tensor.nn",
                "tensor.indexing", "tensor"]
TENSOR_CLASSES = ["CoreTensor", "TensorCreation", "TensorMovement", "TensorMath", "TensorNN",
                  "TensorIndexing", "Tensor"]


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def dotted(path: Path, root: Path = PACKAGE.parent) -> str:
    """tinyteach/render/c.py -> 'tinyteach.render.c'; tinyteach/tensor/__init__.py ->
    'tinyteach.tensor'."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def name_of(path: Path) -> str:
    """The module's name inside the package: 'render.c', 'tensor'; '' for tinyteach itself."""
    return dotted(path).removeprefix("tinyteach").removeprefix(".")


def layer_name(name: str) -> str:
    """'codegen.lower' -> 'codegen', 'ir.uop' -> 'ir.uop', 'opt.search' -> 'engine.realize'."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in SAME_LAYER:
            return SAME_LAYER[prefix]
        if prefix in LAYERS:
            return prefix
    return name


def level(name: str) -> int:
    return LAYERS.index(layer_name(name))


def module_names() -> set[str]:
    """Every module of tinyteach and viz, dotted ('tinyteach.ir.uop', 'viz.magic')."""
    found = {dotted(p) for p in modules()}
    return found | {dotted(p) for p in VIZ.rglob("*.py") if "__pycache__" not in p.parts}


def imports_of(path: Path, known: set[str] | None = None) -> list[tuple[str, bool]]:
    """(module name, imported inside a function?) for every import in the file. With `known`
    (module names), `from package import module` names the module itself."""
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
                package = dotted(path).split(".")
                package = package if path.name == "__init__.py" else package[:-1]
                base = ".".join(package[:len(package) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.append((module, lazy))
            found += [(f"{module}.{alias.name}", lazy) for alias in node.names
                      if known is not None and f"{module}.{alias.name}" in known]
    return found


def test_every_module_has_a_known_layer():
    names = [name_of(p) for p in modules() if name_of(p)]
    unknown = sorted({name for name in names if layer_name(name) not in LAYERS})
    assert unknown == [], f"add {unknown} to the layer order (tinyteach/__init__.py and here)"


def test_the_order_matches_the_package_docstring():
    doc = " ".join((tinyteach.__doc__ or "").split())
    stated = "settings, helpers, dtype, ir/uop, ir/view, ir/rewrite, device, engine/schedule, " \
             "codegen/, opt/, render/, runtime/, engine/realize, tensor/, then engine/jit, nn/ " \
             "and exercises/ on top"
    assert stated in doc
    listed = stated.removesuffix(" on top").replace(", then", ",").replace(" and", ",")
    assert [name.strip("/").replace("/", ".") for name in listed.split(", ")] == LAYERS
    assert all(part.replace(".", "/") in doc for part in TENSOR_PARTS[:-1])
    assert "tensor/__init__.py on top" in doc


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down(path):
    if path == PACKAGE / "__init__.py":
        return  # the package entry point re-exports the public API from every layer
    own = name_of(path)
    known = module_names()
    upward = []
    for module, _inside_a_function in imports_of(path, known):
        parts = module.split(".")
        if parts[0] != "tinyteach" or len(parts) < 2:
            continue
        target = ".".join(parts[1:])
        if layer_name(target) not in LAYERS:
            upward.append(f"{module} (unknown layer)")
        elif level(target) > level(own):
            upward.append(module)
    assert upward == [], f"{own} must not import modules above it: {upward}"


# ---- no import circles, but the magic's bridge ----

def import_graph() -> dict[str, set[str]]:
    """module -> the modules it imports (at the top of the file or inside a function), over
    tinyteach and viz. `from tinyteach.opt import Kernel` is an edge to tinyteach.opt (its
    __init__.py), `from tinyteach.engine import jit` one to tinyteach.engine.jit. Importing a
    module runs its packages' __init__.py first; those edges are left out (every module would
    import tinyteach/__init__.py, which imports the public API)."""
    known = module_names()
    paths = modules() + sorted(p for p in VIZ.rglob("*.py") if "__pycache__" not in p.parts)
    graph: dict[str, set[str]] = {}
    for path in paths:
        own = dotted(path)
        targets = set()
        for module, _ in imports_of(path, known):
            while module and module not in known:  # from x.y import name: the module x.y
                module = module.rpartition(".")[0]
            if module and module != own:
                targets.add(module)
        graph[own] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, with a stack of
    its own: no recursion), each sorted: every import circle lies inside one."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


BRIDGE = ("tinyteach", "viz.magic")  # `%load_ext tinyteach`: load_ipython_extension imports viz


def test_there_are_no_import_circles_but_the_magics_bridge():
    graph = import_graph()
    assert BRIDGE[1] in graph[BRIDGE[0]]  # the bridge is there (viz imports tinyteach back) ...
    lazy = [module for module, inside in imports_of(PACKAGE / "__init__.py") if inside]
    assert lazy == [BRIDGE[1]]  # ... inside the function IPython calls, and nothing else is
    graph[BRIDGE[0]] = graph[BRIDGE[0]] - {BRIDGE[1]}
    assert cycles(graph) == []


def test_the_circle_finder_finds_a_circle():
    # the test can fail: codegen/lower.py importing the heuristic back (as its shortcut once
    # did, inside a function) is a circle through opt/heuristic.py and opt/kernel.py
    graph = import_graph()
    graph["tinyteach.codegen.lower"] = graph["tinyteach.codegen.lower"] | \
        {"tinyteach.opt.heuristic"}
    assert ["tinyteach.codegen.lower", "tinyteach.opt.heuristic", "tinyteach.opt.kernel"] in \
        cycles(graph)
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


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
    # the test can fail: a fake ir/uop.py that imports the tensor layer is flagged
    source = "import tinyteach.tensor\ndef f():\n    from tinyteach.engine.schedule import x\n"
    path = tmp_path / "uop.py"
    path.write_text(source)
    found = imports_of(path)
    assert ("tinyteach.tensor", False) in found and ("tinyteach.engine.schedule", True) in found
    assert level("tensor") > level("ir.uop") and level("engine.schedule") > level("ir.uop")
    assert level("opt.search") > level("runtime.python") > level("opt.kernel") > \
        level("codegen.lower")


# ---- inside the tensor layer: each part of Tensor stands on the parts below it ----

def part_path(name: str) -> Path:
    return PACKAGE / "tensor/__init__.py" if name == "tensor" else \
        PACKAGE / f"{name.replace('.', '/')}.py"


@pytest.mark.parametrize("name", TENSOR_PARTS)
def test_each_tensor_part_imports_only_parts_below_it(name):
    below = TENSOR_PARTS[:TENSOR_PARTS.index(name)]
    wrong = []
    for module, lazy in imports_of(part_path(name)):
        inside = module.removeprefix("tinyteach.")
        if module.startswith("tinyteach.") and inside in TENSOR_PARTS:
            if inside not in below or lazy:
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
    source = part_path(TENSOR_PARTS[index]).read_text()
    assert unknown_names(cls, source) == []


def test_the_part_checker_catches_a_method_from_above():
    # the test can fail: a method of the core that calls softmax (tensor/nn.py) is flagged
    source = ("class CoreTensor:\n    def f(self):\n"
              "        return self.softmax() + type(self).ones(1)\n")
    assert unknown_names(CoreTensor, source) == ["f uses ones", "f uses softmax"]
