"""The fast pattern matcher (an index by root op, early reject, no copies of the bindings)
finds exactly what the plain one does: every kernel of an op suite and of an MLP training step
lowers to the same UOps, and renders to the same C, with a reference matcher that tries every
rule in table order and copies the bindings for each source order (the engine as chapter 5
first wrote it)."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tinyteach.codegen.lower as lower_module
import tinyteach.opt.pack as pack_module
from tinyteach import Tensor, nn
from tinyteach.device import Device, HostMemory
from tinyteach.dtype import DType, dtypes
from tinyteach.ir.rewrite import COMMUTATIVE, PatternMatcher, UPat, symbolic
from tinyteach.ir.uop import Ops, UOp

_ANY_ARG = UPat().arg


def reference_match(pattern: UPat, node: UOp, bindings: dict[str, UOp]) -> bool:
    """UPat.match as it was first written: the op tuple built per call, a copy per order."""
    if pattern.op is not None:
        ops = pattern.op if isinstance(pattern.op, tuple) else (pattern.op,)
        if node.op not in ops:
            return False
    if pattern.dtype is not None and node.dtype != pattern.dtype:
        return False
    if pattern.arg is not _ANY_ARG:
        if isinstance(pattern.arg, bool) and type(node.arg) is not bool:
            return False
        if node.arg != pattern.arg:
            return False
    if pattern.name is not None:
        if pattern.name in bindings and bindings[pattern.name] is not node:
            return False
        bindings[pattern.name] = node
    if pattern.src is None:
        return True
    if len(pattern.src) != len(node.src):
        return False
    orders = [node.src]
    if node.op in COMMUTATIVE and len(node.src) == 2:
        orders.append(node.src[::-1])
    for sources in orders:
        attempt = dict(bindings)
        if all(reference_match(p, s, attempt) for p, s in zip(pattern.src, sources)):
            bindings.update(attempt)
            return True
    return False


class ReferenceMatcher(PatternMatcher):
    """Every rule, in table order, at every node: no index, no early reject."""

    def rewrite(self, node: UOp) -> tuple[str, UOp] | None:
        for rule_name, pattern, build in self.rules:
            bindings: dict[str, UOp] = {}
            if reference_match(pattern, node, bindings):
                result = build(**bindings)
                if result is not None and result is not node:
                    return rule_name, result
        return None


def _op_suite() -> list[Tensor]:
    rng = np.random.default_rng(0)
    a = Tensor(rng.standard_normal((6, 10)).astype(np.float32))
    b = Tensor(rng.standard_normal((10, 7)).astype(np.float32))
    image = Tensor(rng.standard_normal((2, 3, 9, 9)).astype(np.float32))
    weight = Tensor(rng.standard_normal((4, 3, 3, 3)).astype(np.float32))
    ints = Tensor(rng.integers(-20, 20, (5, 8)).astype(np.int32))
    return [
        (a + 1).relu() * a.exp(), a.sum(), a.sum(1), a.max(0), a @ b, a.softmax(-1),
        a.layernorm(-1), a.T.contiguous(), a.reshape(3, 20).permute(1, 0) * 2,
        a.pad(((1, 2), (0, 3))).flip(0), a[1:5, ::2] - 3, a.cumsum(1),
        (a > 0).where(a, -a), a.cast(dtypes.int32), ints // 3 + ints % 5,
        image.conv2d(weight, padding=1), image.max_pool2d(2), image.mean((2, 3)),
        a.argmax(1), a.log_softmax(-1), (a * b.T[:6]).sum(0, keepdim=True),
    ]


def _mlp_step() -> list[Tensor]:
    rng = np.random.default_rng(1)
    l1, l2 = nn.Linear(20, 16), nn.Linear(16, 4)
    params = [l1.weight, l1.bias, l2.weight, l2.bias]
    optimizer = nn.optim.Adam(params, lr=1e-3)
    x = Tensor(rng.random((8, 20), dtype=np.float32), requires_grad=False)
    y = Tensor(rng.integers(0, 4, 8).astype(np.int32), requires_grad=False)
    with Tensor.train():
        optimizer.zero_grad()
        loss = l2(l1(x).relu()).sparse_categorical_crossentropy(y).backward()
        return [loss, *optimizer.schedule_step()]


def _kernels(tensors: list[Tensor]) -> list[Any]:
    items = tensors[0].schedule(*tensors[1:])
    return [item for item in items if item.kind == "kernel"]


def _lower_all(items: list[Any], matcher: PatternMatcher,
               monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[UOp], str]]:
    backend = Device["CPU"]
    from tinyteach.opt import search
    with monkeypatch.context() as patch:
        patch.setattr(lower_module, "symbolic", matcher)
        patch.setattr(pack_module, "symbolic", matcher)
        patch.setattr(lower_module, "_symbolic_memo", {})
        programs = []
        for item in items:
            linear = lower_module.lower(item.ast, search.options_for(backend, item.name, item.ast))
            programs.append((list(linear.uops), backend.renderer.render(item.name, linear)))
    return programs


@pytest.mark.parametrize("suite", [_op_suite, _mlp_step], ids=["op suite", "mlp step"])
def test_fast_matcher_lowers_every_kernel_as_the_reference(suite, monkeypatch):
    items = _kernels(suite())
    assert len(items) >= 5
    reference = _lower_all(items, ReferenceMatcher("symbolic", symbolic.rules), monkeypatch)
    fast = _lower_all(items, symbolic, monkeypatch)
    for item, (ref_uops, ref_source), (uops, source) in zip(items, reference, fast):
        assert source == ref_source, item.name
        assert len(uops) == len(ref_uops) and all(a is b for a, b in zip(uops, ref_uops))


def test_early_reject_keeps_the_first_matching_rule():
    i = UOp(Ops.RANGE, dtypes.int32, (), ("g", 0, 4))
    rules = [("needs a const", UPat(Ops.ADD, src=(UPat.var("x"), UPat.cvar("c"))),
              lambda x, c: x),
             ("any add", UPat(Ops.ADD, name="node"), lambda node: node.src[0] * 3)]
    matcher = PatternMatcher("two", rules)
    assert matcher.rewrite(i + 5) == ("needs a const", i)
    assert matcher.rewrite(i + i) == ("any add", i * 3)  # no CONST source: the first is skipped
    for node in (i + 5, i + i, 5 + i, i * 2):
        assert matcher.rewrite(node) == ReferenceMatcher("two", rules).rewrite(node)


def test_a_failed_match_leaves_the_bindings_as_they_were():
    i, j = (UOp(Ops.RANGE, dtypes.int32, (), (name, 0, 4)) for name in "gh")
    pattern = UPat(Ops.MUL, src=(UPat.var("x"), UPat.const(1)))
    bindings = {"y": j}
    assert not pattern.match(i * 2, bindings)  # both orders tried, both failed
    assert bindings == {"y": j}
    assert pattern.match(1 * i, bindings) and bindings == {"y": j, "x": i}


def test_dtypes_equal_and_hash_alike_when_built_apart():
    built = DType(11, 4, "float32", "float")
    assert built == dtypes.float32 and hash(built) == hash(dtypes.float32)
    assert {dtypes.float32: 1}[built] == 1
    assert dtypes.float32.vec(4) == dtypes.float32.vec(4) != dtypes.float32
    assert dtypes.float32.vec(4).scalar == dtypes.float32
    assert dtypes.float32 != dtypes.int32 and dtypes.float32 != "float32"
    assert sorted([dtypes.float32, dtypes.int8]) == [dtypes.int8, dtypes.float32]


def test_pooled_host_memory_keeps_its_address():
    memory = HostMemory(4096 + 8)
    address = memory.address
    del memory
    again = HostMemory(4096 + 8)  # the pooled array comes back, with its address
    assert again.address == again.array.ctypes.data == address
    again.view(np.dtype(np.float32), 4)[:] = 1.0
    assert again.view(np.dtype(np.float32), 4).tolist() == [1.0] * 4
