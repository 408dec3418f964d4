"""Chapter 11's claims about what the compiler makes of a training step, and its numerics.

- a JIT-less Adam step on the chapter's MLP: 3 kernels per parameter (m, v, the parameter: one
  output each) plus one for the step counters, and the parameter's kernel reads the new m and v;
- the chapter's table of a step's forward, loss and backward kernels (dl-42) is the list the
  scheduler makes, in the order they run, and every update kernel is stored because it is an
  output (dl-44);
- the one-hot of the cross-entropy comes from an arange kernel that every step runs;
- log_softmax stays finite where log(softmax) does not (PyTorch in float64 as the reference);
- a float16 matmul accumulates in float16, `.float()` first accumulates in float32 (numpy's
  float64 products of the same inputs as the reference).
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tinyteach import Device, Tensor, nn
from tinyteach.engine.realize import Launch, record_launches
from tinyteach.nn.state import get_parameters, get_state_dict

torch = pytest.importorskip("torch")


class MLP:
    """The chapter's two-layer perceptron for 8x8 images."""

    def __init__(self) -> None:
        self.l1 = nn.Linear(64, 64)
        self.l2 = nn.Linear(64, 10)

    def __call__(self, images: Tensor) -> Tensor:
        return self.l2(self.l1(images.flatten(1)).relu())


@pytest.fixture
def cpu() -> Iterator[None]:
    previous = Device.DEFAULT
    Device.DEFAULT = "CPU"
    yield
    Device.DEFAULT = previous


def _second_step_launches() -> tuple[list[Launch], nn.optim.LAMB]:
    """The launches of the second JIT-less Adam step (the first also fills the zero state)."""
    Tensor.manual_seed(3)
    draw = np.random.default_rng(3)
    model = MLP()
    adam = nn.optim.Adam(get_parameters(model), lr=1e-2)
    images = Tensor(draw.random((64, 1, 8, 8)).astype(np.float32)).realize()
    labels = Tensor(draw.integers(0, 10, 64).astype(np.int32)).realize()
    steps: list[list[Launch]] = []
    losses = []  # kept alive, as in a training loop: the step computes them before the update
    for _ in range(2):
        with Tensor.train(), record_launches() as launches:
            adam.zero_grad()
            losses.append(model(images).sparse_categorical_crossentropy(labels).backward())
            adam.step()
        steps.append(launches)
    return steps[-1], adam


def _writes(launch: Launch, tensor: Tensor) -> bool:
    return launch.item.output.storage is tensor._buffer().storage


def test_adam_writes_m_v_and_parameter_in_three_kernels(cpu: None) -> None:
    launches, adam = _second_step_launches()
    for index, parameter in enumerate(adam.params):
        m, v = adam.m[index], adam.v[index]
        writers = [[n for n, launch in enumerate(launches) if _writes(launch, tensor)]
                   for tensor in (m, v, parameter)]
        assert all(len(found) == 1 for found in writers), writers   # one kernel per tensor
        m_kernel, v_kernel, update_kernel = (found[0] for found in writers)
        assert m_kernel < update_kernel and v_kernel < update_kernel
        read = [buffer.storage for buffer in launches[update_kernel].item.buffers[1:]]
        assert m._buffer().storage in read and v._buffer().storage in read
    counters = [launch for launch in launches if _writes(launch, adam.beta_powers)]
    assert len(counters) == 1
    optimizer_kernels = 3 * len(adam.params) + 1
    assert len(launches) - optimizer_kernels == 14  # 2 matmuls, 5 loss kernels, 7 backward


CHAPTER = Path(__file__).parent.parent / "chapters" / "11_deep_learning.ipynb"


def chapter_table() -> list[tuple[str, str]]:
    """The rows (kernel name, what it stores) of the table in chapter 11's cell dl-42."""
    cells = json.loads(CHAPTER.read_text())["cells"]
    text = "".join(next(cell["source"] for cell in cells if cell["id"] == "dl-42"))
    return re.findall(r"^\| `(\w+)` \| (.+) \|$", text, flags=re.MULTILINE)


def _chapter_step() -> tuple[list[Launch], nn.optim.LAMB, list[Tensor]]:
    """dl-41's second step: its MLP and Adam, images that need no gradient, the first step
    run and the second recorded; also the tensors the updates write (m, v, the parameters and
    the step counters)."""
    Tensor.manual_seed(3)
    draw = np.random.default_rng(3)
    model = MLP()
    adam = nn.optim.Adam(get_parameters(model), lr=1e-2)
    images = Tensor(draw.random((64, 1, 8, 8)).astype(np.float32), requires_grad=False)
    labels = Tensor(draw.integers(0, 10, 64).astype(np.int32)).realize()
    images.realize()
    Tensor.realize(*get_parameters(model))
    for _ in range(2):
        with Tensor.train(), record_launches() as launches:
            adam.zero_grad()
            loss = model(images).sparse_categorical_crossentropy(labels).backward()
            adam.step()
        del loss
    assert list(get_state_dict(model)) == ["l1.weight", "l1.bias", "l2.weight", "l2.bias"]
    return launches, adam, [*adam.m, *adam.v, *adam.params, adam.beta_powers]


def test_the_chapters_table_lists_the_steps_other_kernels_in_order(cpu: None) -> None:
    launches, adam, updated = _chapter_step()
    memory = {id(tensor._buffer().storage) for tensor in updated}
    updates = [launch for launch in launches if id(launch.item.output.storage) in memory]
    others = [launch.item.name for launch in launches
              if id(launch.item.output.storage) not in memory]
    table = chapter_table()
    assert len(table) == 13, table
    assert others == [name for name, _ in table]
    assert len(updates) == 3 * len(adam.params) + 1 == len(launches) - len(table)
    assert all(launch.item.boundary_reason == "it is an output: realize() asked for it"
               for launch in updates)
    roles = [role for _, role in table]  # the table's words agree with the kernels' shapes
    assert [role.split(":")[0] for role in roles].count("backward") == 6
    assert "arange(10)" in roles[[name for name, _ in table].index("r_10_10")]


def test_chapter_table_reader_fails_on_a_changed_table(cpu: None) -> None:
    """The table check can fail: a table with two rows swapped is not the scheduler's order."""
    launches, _, updated = _chapter_step()
    memory = {id(tensor._buffer().storage) for tensor in updated}
    others = [launch.item.name for launch in launches
              if id(launch.item.output.storage) not in memory]
    swapped = chapter_table()
    swapped[0], swapped[3] = swapped[3], swapped[0]
    assert others != [name for name, _ in swapped]


def test_cross_entropy_reads_an_arange_kernel_every_step(cpu: None) -> None:
    launches, _ = _second_step_launches()
    aranges = [launch for launch in launches if launch.item.name == "r_10_10"]
    assert len(aranges) == 1
    output = aranges[0].item.output
    np.testing.assert_array_equal(output.numpy(), np.arange(1, 11))  # a running sum of ones
    readers = [launch.item for launch in launches
               if any(buffer.storage is output.storage for buffer in launch.item.buffers[1:])]
    # the loss and the gradient (whose sum over classes is fused into it: chapter 6, FUSE_ROWS)
    assert len(readers) == 2
    assert all("CMPNE" in " ".join(item.fusions) for item in readers)


def test_one_hot_from_arange_matches_numpy(cpu: None) -> None:
    labels = np.array([3, 0, 9, 3], dtype=np.int32)
    one_hot = (Tensor(labels).unsqueeze(-1) == Tensor.arange(10)).numpy()
    np.testing.assert_array_equal(one_hot, np.eye(10, dtype=bool)[labels])


def test_log_softmax_is_finite_where_log_of_softmax_is_not(cpu: None) -> None:
    logits = np.array([[1000.0, 0.0, -1000.0], [1.0, 2.0, 3.0]], dtype=np.float32)
    x = Tensor(logits)
    reference = torch.log_softmax(torch.tensor(logits, dtype=torch.float64), -1).numpy()
    np.testing.assert_allclose(x.log_softmax(-1).numpy(), reference, rtol=1e-6)
    naive = (x.exp() / x.exp().sum(-1, keepdim=True)).log().numpy()
    assert np.isnan(naive[0, 0]) and np.isneginf(naive[0, 2])
    assert np.isneginf(x.softmax(-1).log().numpy()[0, 1:]).all()


def test_float16_matmul_accumulates_in_float32_on_every_device(cpu: None) -> None:
    """Chapter 11 (dl-53): a float16 matmul adds in float32 and rounds once, as torch does;
    summed in float16 (a numpy loop) the same inputs lose whole units."""
    values = np.random.default_rng(4)
    a = values.random((16, 4096)).astype(np.float16)
    b = values.random((4096, 16)).astype(np.float16)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    in_half = np.zeros((16, 16), np.float16)
    for k in range(a.shape[1]):
        in_half += a[:, k:k + 1] * b[k:k + 1, :]
    assert np.abs(in_half - exact).max() / exact.max() > 1e-2
    for device in ("NUMPY", "CPU"):
        ours = (Tensor(a, device=device) @ Tensor(b, device=device)).numpy()
        assert ours.dtype == np.float16
        # float32 sums, rounded once to float16: within float16's rounding of the exact result
        np.testing.assert_allclose(ours, exact, rtol=2.0 ** -10)
