"""Chapter 6: the scheduler — kernel counts of the canonical patterns, the reasons it writes
down for every boundary and fusion, COPY/CONTIGUOUS boundaries, and values checked against
numpy."""
from __future__ import annotations

import numpy as np
import pytest

from tinyteach import GlobalCounters, Tensor
from tinyteach.engine.schedule import create_schedule, find_realized
from tinyteach.helpers import Context
from tinyteach.ir.uop import Ops

RNG = np.random.default_rng(0)


def realized(*shape: int, device: str = "NUMPY") -> tuple[Tensor, np.ndarray]:
    values = RNG.normal(size=shape).astype(np.float32)
    return Tensor(values, device=device).realize(), values


def kernels_to_compute(build, device: str = "NUMPY") -> tuple[int, np.ndarray]:
    """How many kernels realizing `build()` launches (inputs realized first)."""
    result = build()
    GlobalCounters.reset()
    values = result.realize()
    count = GlobalCounters.kernel_count
    return count, values.numpy()


def schedule_of(tensor: Tensor):
    items, _ = create_schedule([tensor.uop], tensor.device)
    return items


# ---- kernel counts that must hold ----

@pytest.fixture(params=["NUMPY", "CPU"])
def dev(request) -> str:
    return request.param


def test_elementwise_then_sum_is_one_kernel(dev):
    (a, an), (b, bn), (c, cn) = (realized(4, 8, device=dev) for _ in range(3))
    count, out = kernels_to_compute(lambda: ((a + b) * c).relu().sum(axis=1))
    assert count == 1
    np.testing.assert_allclose(out, np.maximum((an + bn) * cn, 0).sum(axis=1), rtol=1e-5)


def test_matmul_is_one_kernel(dev):
    (x, xn), (w, wn) = realized(5, 7, device=dev), realized(7, 3, device=dev)
    count, out = kernels_to_compute(lambda: x @ w)
    assert count == 1
    np.testing.assert_allclose(out, xn @ wn, rtol=1e-5, atol=1e-5)


def test_softmax_is_at_most_three_kernels(dev):
    x, xn = realized(4, 10, device=dev)
    count, out = kernels_to_compute(lambda: x.softmax(1))
    assert count <= 3
    e = np.exp(xn - xn.max(axis=1, keepdims=True))
    np.testing.assert_allclose(out, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_layernorm_is_at_most_three_kernels(dev):
    x, xn = realized(4, 10, device=dev)
    count, out = kernels_to_compute(lambda: x.layernorm())
    assert count <= 3
    centered = xn - xn.mean(axis=1, keepdims=True)
    expected = centered / np.sqrt((centered ** 2).mean(axis=1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


def numpy_log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


@pytest.mark.parametrize("fuse_rows, kernels", [(0, 4), (1, 1)])
def test_log_softmax_gradient_skips_the_max(dev, fuse_rows, kernels):
    """The result does not depend on the max subtracted for stability, so its gradient is not
    computed (two reductions saved): max, sum of exp, sum of the incoming gradient, result;
    with FUSE_ROWS the three row reductions are computed in the result's kernel."""
    (x, xn), (seed, seed_n) = realized(4, 6, device=dev), realized(4, 6, device=dev)
    x.requires_grad = True
    with Context(FUSE_ROWS=fuse_rows):
        (x.log_softmax(1) * seed).sum().backward()
        assert x.grad is not None
        count, grad = kernels_to_compute(lambda: x.grad, device=dev)
    assert count == kernels
    softmax = np.exp(numpy_log_softmax(xn))
    expected = seed_n - softmax * seed_n.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(grad, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("fuse_rows, kernels", [(0, 7), (1, 6)])
def test_cross_entropy_and_its_gradient_are_seven_kernels(dev, fuse_rows, kernels):
    """max, sum of exp, arange (a running sum), the count of labelled items, the loss, the
    gradient's sum over classes, the gradient. The mean loss is one sum over items and classes
    together: no reduction feeds another. With FUSE_ROWS the gradient's sum over classes is
    computed in the gradient's kernel (the max and the sum of exp are read by the loss too:
    stored)."""
    logits, logits_n = realized(8, 5, device=dev)
    logits.requires_grad = True
    labels_n = np.array([0, 3, 2, -1, 1, 4, 4, 0], dtype=np.int32)  # -1 is ignored
    labels = Tensor(labels_n, device=dev).realize()
    with Context(FUSE_ROWS=fuse_rows):
        loss = logits.sparse_categorical_crossentropy(labels, ignore_index=-1)
        loss.backward()
        assert logits.grad is not None
        items, _ = create_schedule([loss.uop, logits.grad.uop], dev)
        assert len(items) == kernels
        assert not any("another reduction" in item.boundary_reason for item in items)
        fused = [note for item in items for note in item.fusions if "once per row" in note]
        assert len(fused) == fuse_rows
        GlobalCounters.reset()
        Tensor.realize(loss, logits.grad)
        assert GlobalCounters.kernel_count == kernels
    counted = labels_n != -1
    targets = np.eye(5, dtype=np.float32)[np.where(counted, labels_n, 0)] * counted[:, None]
    expected_loss = -(numpy_log_softmax(logits_n) * targets).sum() / counted.sum()
    expected_grad = (np.exp(numpy_log_softmax(logits_n)) * counted[:, None] - targets) \
        / counted.sum()
    np.testing.assert_allclose(loss.numpy(), expected_loss, rtol=1e-5)
    np.testing.assert_allclose(logits.grad.numpy(), expected_grad, rtol=1e-4, atol=1e-6)


def test_elementwise_chain_is_one_kernel():
    (a, an), (b, bn) = realized(3, 4), realized(3, 4)
    count, out = kernels_to_compute(lambda: ((a * 2 + b).exp() - a).relu() * b)
    assert count == 1
    np.testing.assert_allclose(out, np.maximum(np.exp(an * 2 + bn) - an, 0) * bn, rtol=1e-5)


def test_elementwise_onto_a_reductions_output_fuses():
    a, an = realized(3, 4)
    count, out = kernels_to_compute(lambda: (a.sum(axis=1) * 2 + 1).exp())
    assert count == 1
    np.testing.assert_allclose(out, np.exp(an.sum(axis=1) * 2 + 1), rtol=1e-5)


def test_views_of_realized_buffers_need_no_kernel():
    a, an = realized(3, 4)
    for view, expected in [(a.T, an.T), (a.reshape(12), an.reshape(12)), (a[1:, ::2], an[1:, ::2]),
                           (a.permute(1, 0).reshape(2, 6), an.T.reshape(2, 6))]:
        GlobalCounters.reset()
        view.realize()
        assert GlobalCounters.kernel_count == 0
        assert schedule_of(view) == []
        np.testing.assert_array_equal(view.numpy(), expected)


def test_realized_tensor_has_nothing_to_schedule():
    a, _ = realized(3, 4)
    GlobalCounters.reset()
    a.realize()
    assert GlobalCounters.kernel_count == 0


# ---- boundaries and their reasons ----

def test_reduction_used_by_two_kernels_is_stored_once():
    a, an = realized(4, 6)
    total = a.sum(axis=1)
    doubled, shifted = (total * 2).contiguous(), (total + 1).contiguous()
    items = create_schedule([doubled.uop, shifted.uop], "NUMPY")[0]
    reductions = [item for item in items
                  if any(n.op is Ops.REDUCE_AXIS for n in item.ast.toposort)]
    assert len(items) == 3
    assert len(reductions) == 1, "the sum is computed once"
    assert "used by 2 kernels" in reductions[0].boundary_reason
    GlobalCounters.reset()
    Tensor.realize(doubled, shifted)
    assert GlobalCounters.kernel_count == 3
    np.testing.assert_allclose(doubled.numpy(), an.sum(axis=1) * 2, rtol=1e-5)
    np.testing.assert_allclose(shifted.numpy(), an.sum(axis=1) + 1, rtol=1e-5)


def test_reduction_of_a_reduction_is_a_boundary():
    a, an = realized(4, 6)
    items = schedule_of(a.sum(axis=1).max())
    assert len(items) == 2
    assert "another reduction" in items[0].boundary_reason
    assert items[1].boundary_reason.startswith("it is an output")
    assert np.isclose(a.sum(axis=1).max().item(), an.sum(axis=1).max(), rtol=1e-5)


def test_broadcast_reduction_reason_names_expand():
    x, _ = realized(4, 10)
    with Context(FUSE_ROWS=0):  # (with it, the rows are fused: tests/test_fuse_rows.py)
        items = schedule_of(x.softmax(1))
    reasons = " ".join(item.boundary_reason for item in items)
    assert "broadcast" in reasons and "EXPAND" in reasons


def test_every_item_has_plain_word_reasons():
    x, _ = realized(4, 10)
    for item in schedule_of(x.softmax(1)) + schedule_of((x * 2).sum(1)):
        assert item.kind == "kernel"
        assert isinstance(item.boundary_reason, str) and len(item.boundary_reason.split()) >= 3
        assert item.fusions, "each kernel says what it fused"
        assert all(isinstance(note, str) for note in item.fusions + item.input_reasons)
        assert len(item.input_reasons) == len(item.buffers) - 1
        assert item.ast.op is Ops.SINK and item.ast.src[0].op is Ops.STORE


def test_fusion_notes_say_what_was_fused():
    (a, _), (b, _), (c, _) = realized(4, 8), realized(4, 8), realized(4, 8)
    (item,) = schedule_of(((a + b) * c).relu().sum(axis=1))
    notes = " ".join(item.fusions)
    assert "sum over axes (1,)" in notes
    assert "fused into the reduction's input" in notes and "ADD" in notes and "MUL" in notes
    assert item.input_reasons == [f"input {n}: a realized tensor" for n in (1, 2, 3)]
    (scaled,) = schedule_of(a.sum(axis=1) * 3)
    assert "fused onto the reduction's output" in " ".join(scaled.fusions)
    (viewed,) = schedule_of(a.T * 2)
    assert "movement ops became index arithmetic" in " ".join(viewed.fusions) or \
        "elementwise" in " ".join(viewed.fusions)


def test_contiguous_is_a_boundary():
    a, an = realized(3, 4)
    b = (a * 2).contiguous()
    items = schedule_of((b + 1).sum())
    assert len(items) == 2
    assert "contiguous" in items[0].boundary_reason
    assert np.isclose(((a * 2).contiguous() + 1).sum().item(), (an * 2 + 1).sum(), rtol=1e-5)


def test_copy_between_devices_is_its_own_step():
    a, an = realized(3, 4, device="NUMPY")
    moved = (a * 2).to("CPU") + 1
    items = schedule_of(moved)
    kinds = [item.kind for item in items]
    assert kinds.count("copy") == 1
    copy = items[kinds.index("copy")]
    assert "copy" in copy.boundary_reason and copy.device == "CPU"
    assert items[kinds.index("copy") - 1].device == "NUMPY"   # a*2 computed where a lives
    assert items[-1].device == "CPU"
    np.testing.assert_allclose(moved.numpy(), an * 2 + 1, rtol=1e-6)


def test_copy_of_a_realized_buffer_needs_no_kernel():
    a, an = realized(3, 4, device="NUMPY")
    items = schedule_of(a.to("CPU"))
    assert [item.kind for item in items] == ["copy"]
    np.testing.assert_array_equal(a.to("CPU").numpy(), an)


def test_kernel_names_follow_tinygrad():
    a, _ = realized(4, 8)
    assert [i.name for i in schedule_of(a + 1)] == ["E_4_8"]
    assert [i.name for i in schedule_of(a.sum(axis=1))] == ["r_4_8"]
    assert schedule_of(a.sum())[0].name.startswith("r_")


def test_outputs_become_buffers_of_their_shape():
    a, an = realized(3, 4)
    out = a.sum(axis=0)
    items, becomes = create_schedule([out.uop], "NUMPY")
    assert becomes[out.uop].shape == (4,)
    assert items[0].output.size == 4


# ---- assigns that read each other's old values (tinygrad's quickstart SGD) ----

def _train_both(device: str, loss_of, steps: int, seed: int = 0):
    """SGD over x and W for `steps` steps in tinyteach and in PyTorch; both final values."""
    torch = pytest.importorskip("torch")
    from tinyteach.nn.optim import SGD

    rng = np.random.default_rng(seed)
    x0, w0, m0 = (rng.normal(size=s).astype(np.float32) for s in ((2, 3), (3, 3), (2, 3)))
    x, w = Tensor(x0, device=device), Tensor(w0, device=device)
    m = Tensor(m0, device=device)
    tx, tw = torch.tensor(x0, requires_grad=True), torch.tensor(w0, requires_grad=True)
    ours, theirs = SGD([x, w], lr=0.1), torch.optim.SGD([tx, tw], lr=0.1)
    with Tensor.train():
        for _ in range(steps):
            ours.zero_grad()
            loss_of(x, w, m).backward()
            ours.step()
            theirs.zero_grad()
            loss_of(tx, tw, torch.tensor(m0)).backward()
            theirs.step()
    return (x.numpy(), w.numpy()), (tx.detach().numpy(), tw.detach().numpy())


def _quickstart_loss(x, w, m):
    return x.matmul(w).relu().log_softmax(1).mul(m).add(m).sum()


def _matmul_loss(x, w, m):
    return (x @ w).sum()


@pytest.mark.parametrize("loss_of", [_quickstart_loss, _matmul_loss])
def test_sgd_over_two_parameters_that_read_each_other_matches_pytorch(dev, loss_of):
    """dx reads the old W and dW the old x: each assign needs the other's old value, which
    used to raise "cannot order this schedule". Five steps agree with torch.optim.SGD."""
    (x, w), (tx, tw) = _train_both(dev, loss_of, steps=5)
    np.testing.assert_allclose(x, tx, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(w, tw, rtol=1e-5, atol=1e-6)


def test_the_knot_is_cut_by_copying_one_old_value():
    """One copy is enough for two assigns that read each other: the copy runs first, and the
    readers of the old value read the copy."""
    from tinyteach.engine.schedule import OLD_CONTENTS_COPIED

    a, an = realized(3, 3)
    b, bn = realized(3, 3)
    new_a, new_b = a + b.T, b * a.T  # each reads the other's old value
    a.assign(new_a)
    b.assign(new_b)
    items = create_schedule([a.uop, b.uop], "NUMPY")[0]
    copies = [item for item in items if item.boundary_reason == OLD_CONTENTS_COPIED]
    assert len(copies) == 1 and items[0] is copies[0]
    assert len(items) == 3
    Tensor.realize(a, b)
    np.testing.assert_allclose(a.numpy(), an + bn.T, rtol=1e-6)
    np.testing.assert_allclose(b.numpy(), bn * an.T, rtol=1e-6)


def test_swapping_two_tensors_with_assign(dev):
    a0, b0 = RNG.normal(size=5).astype(np.float32), RNG.normal(size=5).astype(np.float32)
    a, b = Tensor(a0, device=dev).realize(), Tensor(b0, device=dev).realize()
    old_a, old_b = Tensor(a.uop, device=dev), Tensor(b.uop, device=dev)
    a.assign(old_b)
    b.assign(old_a)
    Tensor.realize(a, b)
    np.testing.assert_array_equal(a.numpy(), b0)
    np.testing.assert_array_equal(b.numpy(), a0)


def test_a_kernel_can_read_the_old_and_the_new_value(dev):
    """`old + new` in one kernel: the old value is copied before the assign overwrites it."""
    c0 = RNG.normal(size=(2, 4)).astype(np.float32)
    c = Tensor(c0, device=dev).realize()
    old = Tensor(c.uop, device=dev)
    c.assign(c * 2)
    both = old + c
    Tensor.realize(both, c)
    np.testing.assert_allclose(both.numpy(), c0 + 2 * c0, rtol=1e-6)
    np.testing.assert_allclose(c.numpy(), 2 * c0, rtol=1e-6)


def test_a_copy_to_another_device_reads_the_value_before_the_assign():
    c0 = RNG.normal(size=6).astype(np.float32)
    c = Tensor(c0, device="CPU").realize()
    moved = c.to("NUMPY")
    c.assign(c + 10)
    Tensor.realize(c, moved)  # the assign is listed first: the copy still runs before it
    np.testing.assert_allclose(moved.numpy(), c0, rtol=1e-6)
    np.testing.assert_allclose(c.numpy(), c0 + 10, rtol=1e-6)


# ---- ordering (Kahn's algorithm) ----

def _chain_items(count: int):
    """`count` stand-in kernels, each reading the one before (only names and nodes matter)."""
    from tinyteach.dtype import dtypes
    from tinyteach.engine.schedule import ScheduleItem
    from tinyteach.ir.uop import UOp

    nodes = [UOp(Ops.CONST, dtypes.int32, (), k) for k in range(count)]
    return [ScheduleItem("kernel", f"k{k}", nodes[k], [], "NUMPY", "a test", node=nodes[k],
                         input_nodes=nodes[k - 1:k]) for k in range(count)]


def test_order_items_runs_each_kernel_after_its_inputs_whatever_the_listing():
    """A chain of 20,000 kernels listed last-first comes out first-first (Kahn's algorithm;
    picking the first ready item by rescanning took minutes at this length, which shows as a
    suite that does not finish: tests check results, not wall-clock time)."""
    from tinyteach.engine.schedule import order_items

    items = _chain_items(20_000)
    assert order_items(list(reversed(items))) == items


def test_order_items_takes_the_first_listed_of_the_ready_kernels():
    from tinyteach.engine.schedule import order_items

    first, second, third = _chain_items(3)
    second.input_nodes = []  # now nothing waits: the listing decides
    # third waits for second only; once second ran it is the first listed of the ready ones
    assert order_items([third, second, first]) == [second, third, first]
    assert order_items([first, third, second]) == [first, second, third]


def test_order_items_runs_readers_of_the_old_contents_before_the_assign():
    w, wn = realized(4, 4)
    total = (w * 2).sum(1)
    w.assign(w + 1)
    for outputs in ([w.uop, total.uop], [total.uop, w.uop]):
        items = create_schedule(outputs, "NUMPY")[0]
        assert [item.node.op is Ops.ASSIGN for item in items] == [False, True]


def test_costly_work_broadcast_a_few_times_is_stored():
    """A one-channel 3x3 convolution reads its output gradient 9 times (once per tap): below
    the 16 copies of BROADCAST_RECOMPUTE_LIMIT, but behind a max-pool and a ReLU that gradient
    takes COSTLY_OPS ops or more, and 9 copies reach MIN_BROADCAST_COPIES. It is stored, and
    the weight gradient is a plain sum (6.1 -> 0.2 ms for the CNN benchmark's conv1). Two
    cheap ops 9 times stay fused. The gradients agree with torch either way."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    x = rng.normal(size=(4, 1, 10, 10)).astype(np.float32)
    w = rng.normal(size=(3, 1, 3, 3)).astype(np.float32)
    weight = Tensor(w, requires_grad=True)
    Tensor(x).conv2d(weight).relu().max_pool2d(2).sum().backward()
    found = find_realized([weight.grad.uop])
    assert any("broadcast 9x into a reduction" in why for why in found.values())
    tw = torch.tensor(w, requires_grad=True)
    torch.nn.functional.max_pool2d(torch.nn.functional.conv2d(torch.tensor(x), tw).relu(),
                                   2).sum().backward()
    np.testing.assert_allclose(weight.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-4)
    cheap = Tensor(w, requires_grad=True)
    upstream = Tensor(rng.normal(size=(4, 3, 8, 8)).astype(np.float32))
    (Tensor(x).conv2d(cheap) * (upstream * 2 + 1)).sum().backward()
    assert not any("broadcast 9x" in why for why in find_realized([cheap.grad.uop]).values())


def test_an_activation_read_through_a_window_of_both_axes_is_stored():
    """A 5x5 window is one expand per axis (pool's _windows_1d): the first alone is a few
    copies, the second's shape counts them all. The ReLU of a first convolution, read by a
    second 5x5 one once per tap, is stored once (it was recomputed for each of the 25 taps:
    beautiful_mnist's conv2 forward took 22-23 ms, 10-17 with it stored), and the result
    equals torch's."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(12)
    x, w1, w2 = (rng.normal(size=s).astype(np.float32)
                 for s in ((2, 4, 12, 12), (6, 4, 3, 3), (5, 6, 5, 5)))
    out = Tensor(x).conv2d(Tensor(w1)).relu().conv2d(Tensor(w2))
    found = find_realized([out.uop])
    assert any("broadcast" in why and "into a reduction" in why for why in found.values())
    F = torch.nn.functional
    expected = F.conv2d(F.conv2d(torch.tensor(x), torch.tensor(w1)).relu(), torch.tensor(w2))
    np.testing.assert_allclose(out.numpy(), expected.numpy(), rtol=1e-4, atol=1e-4)


def test_a_sum_of_many_buffers_read_by_two_kernels_is_stored():
    """A GPT's residual stream x0 + a1 + m1 + ...: recomputed by each kernel that reads it,
    every one of them would read all the terms; stored, each reads one buffer."""
    terms = [Tensor.rand(64, 256).realize() for _ in range(6)]
    stream = terms[0]
    for term in terms[1:]:
        stream = stream + term
    rows, columns = stream.sum(1), stream.max(0)
    items = create_schedule([rows.uop, columns.uop], "NUMPY")[0]
    assert len(items) == 3
    stored = [item for item in items if "recompute it from 6 buffers" in item.boundary_reason]
    assert len(stored) == 1 and len(stored[0].buffers) == 7  # its output and the 6 terms
    assert all(len(item.buffers) == 2 for item in items if item is not stored[0])
    assert np.allclose(rows.numpy(), sum(t.numpy() for t in terms).sum(1), rtol=1e-5)


def test_a_sum_of_two_buffers_read_by_two_kernels_is_recomputed():
    """a + b read by two reductions: recomputing reads 2 x 2 elements per output element,
    storing 2 + 1 + 2 (a kernel more): it stays fused."""
    a, b = Tensor.rand(64, 256).realize(), Tensor.rand(64, 256).realize()
    both = a + b
    items = create_schedule([both.sum(1).uop, both.max(0).uop], "NUMPY")[0]
    assert len(items) == 2
