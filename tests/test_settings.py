"""Every setting in one place (tinyteach/settings.py): the README's table lists exactly its
settings, no module reads a setting that is not there, the plan cache's snapshot follows every
setting and limit that compiles, and clear_caches() empties every memo in the process."""
from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

import tinyteach
from tinyteach import Tensor, helpers, settings
from tinyteach.dtype import dtypes
from tinyteach.helpers import MEMOS, cache_sizes, clear_caches, memo_size, register_memo
from tinyteach.settings import Context, ContextVar, EnvironmentVariable, knobs, snapshot

PACKAGE = Path(tinyteach.__file__).parent
ROOT = PACKAGE.parent


# ---- the README's table ----

def readme_rows() -> dict[str, tuple[str, str]]:
    """The settings table of README.md: name -> (kind, default)."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        match = re.match(r"\| `([A-Z_0-9]+)` \| ([^|]+) \| ([^|]+) \|", line)
        if match:
            name, kind, default = match.groups()
            assert name not in rows, f"{name} is in the README's table twice"
            rows[name] = (kind.strip(), default.strip())
    return rows


def test_the_readme_lists_every_setting():
    missing = sorted(set(knobs()) - set(readme_rows()))
    assert missing == [], f"add {missing} to the README's settings table"


def test_every_row_of_the_readme_is_a_setting():
    unknown = sorted(set(readme_rows()) - set(knobs()))
    assert unknown == [], f"the README's settings table lists {unknown}, which settings.py lacks"


def test_the_readme_gives_each_setting_its_kind_and_default():
    rows = readme_rows()
    for name, knob in knobs().items():
        kind = "`Context`" if isinstance(knob, ContextVar) else "environment"
        assert rows[name] == (kind, knob.shown_default), name


def test_the_table_reader_can_fail():
    # the test can fail: a table without CC, and a row nobody defines, are both seen
    rows = dict(readme_rows())
    del rows["CC"]
    rows["NO_SUCH_SETTING"] = ("environment", "0")
    assert set(knobs()) - set(rows) == {"CC"} and set(rows) - set(knobs()) == {"NO_SUCH_SETTING"}


def test_every_setting_says_what_it_does():
    for name, knob in knobs().items():
        assert knob.meaning and len(knob.meaning) < 120, name


# ---- no module reads a setting of its own ----

def sources() -> list[Path]:
    return sorted(p for folder in (PACKAGE, ROOT / "viz") for p in folder.rglob("*.py")
                  if "__pycache__" not in p.parts)


def raw_environment_reads(path: Path) -> list[str]:
    """Where a file reads os.environ or os.getenv (writing `os.environ[key] = ...` is fine)."""
    tree = ast.parse(path.read_text())
    stores = {id(node.value) for node in ast.walk(tree)
              if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv") and \
                isinstance(node.value, ast.Name) and node.value.id == "os" and \
                id(node) not in stores:
            found.append(f"{path.name}:{node.lineno}")
    return found


def contextvars_defined(path: Path) -> list[str]:
    """The keys of the ContextVar(...) calls in a file."""
    tree = ast.parse(path.read_text())
    return [node.args[0].value for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and
            node.func.id == "ContextVar" and node.args and isinstance(node.args[0], ast.Constant)]


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_only_settings_reads_the_environment(path):
    if path == PACKAGE / "settings.py":
        return
    assert raw_environment_reads(path) == [], "read it through a setting of settings.py"


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_contextvar_is_one_of_settings(path):
    # a module that still defines its own copy (lower, pack, realize, until they import
    # settings') must define one that settings.py lists
    listed = set(contextvars_defined(PACKAGE / "settings.py"))
    assert set(contextvars_defined(path)) <= listed


def test_the_environment_checker_can_fail(tmp_path):
    fake = tmp_path / "fake.py"
    fake.write_text('import os\nA = os.environ.get("A")\nB = os.getenv("B")\n'
                    'os.environ["C"] = "1"\nX = ContextVar("X", 0)\n')
    assert sorted(raw_environment_reads(fake)) == ["fake.py:2", "fake.py:3"]
    assert contextvars_defined(fake) == ["X"]


def test_every_contextvar_is_known_to_context():
    assert set(ContextVar.registry) == set(contextvars_defined(PACKAGE / "settings.py"))
    for name in ContextVar.registry:
        with Context(**{name: ContextVar.registry[name].value}):
            pass
    with pytest.raises(KeyError, match="NO_SUCH"):
        with Context(NO_SUCH=1):
            pass


def test_the_old_homes_still_work():
    from tinyteach.codegen.transcendental import TRANSCENDENTAL
    from tinyteach.helpers import BEAM, DEBUG, NOOPT, TRAINING, getenv
    from tinyteach.runtime import CPU_TIERED

    assert (DEBUG, NOOPT, BEAM, TRAINING) == (settings.DEBUG, settings.NOOPT, settings.BEAM,
                                              settings.TRAINING)
    assert CPU_TIERED is settings.CPU_TIERED and TRANSCENDENTAL is settings.TRANSCENDENTAL
    assert helpers.ContextVar is ContextVar and helpers.Context is Context
    assert tinyteach.getenv is getenv is settings.getenv


def test_an_environment_variable_is_read_when_asked(monkeypatch):
    monkeypatch.delenv("CPU_ARCH", raising=False)
    assert settings.CPU_ARCH.value == ""
    monkeypatch.setenv("CPU_ARCH", "x86-64-v3")
    assert settings.CPU_ARCH.value == "x86-64-v3"
    monkeypatch.delenv("CUDA_ARCH", raising=False)
    assert settings.CUDA_ARCH.get("sm_90") == "sm_90"
    with pytest.raises(ValueError, match="listed twice"):
        EnvironmentVariable("CC", None, "again")


def test_default_float_is_applied(monkeypatch):
    with Context(DEFAULT_FLOAT="half"):
        assert dtypes.default_float == dtypes.float16
        assert Tensor([1.5]).dtype == dtypes.float16
    assert dtypes.default_float == dtypes.float32
    with pytest.raises(ValueError, match="DEFAULT_FLOAT must be a float"):
        with Context(DEFAULT_FLOAT="int32"):
            pass
    assert dtypes.default_float == dtypes.float32


@pytest.mark.parametrize("environment, expected", [
    ({"DEV": "NUMPY"}, "NUMPY"), ({"PYTHON": "1"}, "PYTHON"), ({"CPU": "0"}, None),
    ({"DEV": "CPU", "NUMPY": "1"}, "CPU"), ({}, None)])
def test_the_device_the_environment_chooses(monkeypatch, environment, expected):
    from tinyteach.device import KNOWN_DEVICES

    for name in ("DEV", *KNOWN_DEVICES):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert settings.chosen_device(KNOWN_DEVICES) == expected


# ---- the plan cache's snapshot ----

def test_the_snapshot_is_hashable_and_follows_what_compiles():
    before = snapshot()
    hash(before)
    for name, var in ContextVar.registry.items():
        if isinstance(var.value, int):
            with Context(**{name: var.value + 1}):
                assert (snapshot() != before) == var.compiles, name
    assert snapshot() == before
    assert not settings.DEBUG.compiles and not settings.PLAN_CACHE.compiles
    assert settings.FUSE_ROWS.compiles and settings.BEAM.compiles


@pytest.mark.parametrize("limit", settings.LIMITS, ids=lambda limit: limit.name)
def test_the_snapshot_follows_every_limit(monkeypatch, limit):
    module = importlib.import_module(limit.module)
    assert isinstance(getattr(module, limit.name), int)
    before = snapshot()
    monkeypatch.setattr(module, limit.name, getattr(module, limit.name) + 1)
    assert snapshot() != before


def test_the_snapshot_reads_the_limits_listed():
    assert snapshot()[1:] == tuple(limit.value() for limit in settings.LIMITS)
    assert snapshot()[0] == tuple(var.value for var in ContextVar.registry.values()
                                  if var.compiles)


def test_the_fused_row_limit_is_in_the_snapshot():
    # the plan cache's old key listed five limits by hand and missed this one
    assert "MAX_FUSED_ROW_BYTES" in {limit.name for limit in settings.LIMITS}


# ---- every memo is emptied by clear_caches() ----

def fill_reference_accuracy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The autograder's reference run, its training replaced by a stand-in (it takes minutes)."""
    from tinyteach.exercises import autograder

    monkeypatch.setattr(autograder, "train_digits", lambda device, steps: 0.5)
    assert autograder.reference_accuracy(1) == 0.5


def fill_cpu_target(monkeypatch: pytest.MonkeyPatch) -> None:
    from tinyteach.device import DeviceUnavailable
    from tinyteach.runtime import cpu

    try:
        cpu.cpu_target(cpu.find_c_compiler())
    except DeviceUnavailable:
        pytest.skip("no C compiler here")


def fill_in_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    from tinyteach.ir.uop import Ops
    from tinyteach.render.c import CRenderer, in_float32

    in_float32(CRenderer().code(Ops.ADD), Ops.ADD)


def fill_tensor_memos(monkeypatch: pytest.MonkeyPatch) -> Tensor:
    """Returns a lazy tensor: its graph is the weak key of the buffers it reads."""
    weights = Tensor([1.0, 2.0, 3.0], device="NUMPY").realize()
    other = Tensor([4.0], device="NUMPY").realize()
    lazy = other * 2  # the assign asks which buffers this graph reads (not the weights)
    weights.assign(weights + 1).realize()
    assert weights.tolist() == [2.0, 3.0, 4.0]
    return lazy


def fill_view_memos(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel through a reshape, lowered (the emulator's: NUMPY interprets views whole)."""
    out = Tensor.ones(2, 3, device="PYTHON").reshape(3, 2).permute(1, 0).contiguous()
    assert out.tolist() == [[1.0] * 3] * 2


def fill_lowering_memos(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sum lowered and run: its index math is simplified (lower.symbolic)."""
    x = Tensor.ones(4, 8, device="CPU").realize()
    assert (x.sum(axis=1) + 1).tolist() == [9.0] * 4


# what fills each memo, by its name (a new memo needs a line here)
FILLERS = {
    "lower.symbolic": fill_lowering_memos,
    "view.contiguous_strides": fill_view_memos,
    "view.reshape_plans": fill_view_memos,
    "uop.truncated": fill_tensor_memos,
    "tensor.constants": fill_tensor_memos,
    "render.c.in_float32": fill_in_float32,
    "cpu.predefined_macros": fill_cpu_target,
    "cpu.checked_targets": fill_cpu_target,
    "exercises.reference_accuracy": fill_reference_accuracy,
}
MODULES_WITH_MEMOS = ["tinyteach.render.c", "tinyteach.runtime.cpu",
                      "tinyteach.exercises.autograder"]


def test_every_memo_has_a_filler():
    for module in MODULES_WITH_MEMOS:
        importlib.import_module(module)
    assert set(MEMOS) == set(FILLERS)


@pytest.mark.parametrize("name", sorted(FILLERS))
def test_clear_caches_empties_the_memo(monkeypatch, name):
    for module in MODULES_WITH_MEMOS:
        importlib.import_module(module)
    clear_caches()
    assert memo_size(MEMOS[name]) == 0
    kept = FILLERS[name](monkeypatch)  # noqa: F841  (alive while the memo is measured)
    assert memo_size(MEMOS[name]) > 0, f"{FILLERS[name].__name__} does not fill {name}"
    clear_caches()
    assert memo_size(MEMOS[name]) == 0


def test_clear_caches_empties_every_memo_in_the_process(monkeypatch):
    kept = [filler(monkeypatch) for filler in dict.fromkeys(FILLERS.values())]  # noqa: F841
    (Tensor.ones(4, device="NUMPY") + 1).realize()
    assert sum(cache_sizes().values()) > 0
    clear_caches()
    assert {name: size for name, size in cache_sizes().items() if size} == {}


def test_a_memo_must_be_clearable():
    with pytest.raises(TypeError, match="cache_clear"):
        register_memo("test.not_a_memo", 3)
    with pytest.raises(ValueError, match="two memos"):
        register_memo("uop.truncated", {})
