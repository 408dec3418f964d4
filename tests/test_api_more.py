"""tinygrad's Tensor API beyond the basics (issue 13), part 2: named forms of the operators,
properties, creation, reductions, movement, cumulative ops, einsum, losses, attention and
sorting — forward and backward against PyTorch, with edge cases and errors.

Runs on NUMPY and CPU only (the shared machine's cores); tests/test_ops.py runs every device.
"""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from helpers import check, compare

from tinyteach import Tensor, dtypes
from tinyteach.device import Device

torch = pytest.importorskip("torch")
F = torch.nn.functional


@pytest.fixture(params=["NUMPY", "CPU"])
def device(request: pytest.FixtureRequest) -> Iterator[str]:
    previous = Device.DEFAULT
    Device.DEFAULT = request.param
    yield request.param
    Device.DEFAULT = previous


# ---- the named forms of the operators, and functions tests elsewhere reach by name only ----

def test_named_arithmetic(device: str) -> None:
    check(lambda a, b: a.add(b), torch.add, [(3, 4), (4,)], device)
    check(lambda a, b: a.sub(b), torch.sub, [(3, 4), (3, 1)], device)
    check(lambda a, b: a.mul(b), torch.mul, [(3, 4), (3, 4)], device)
    check(lambda a, b: a.div(b), torch.div, [(3, 4), (3, 4)], device, low=0.5, high=2.0)
    check(lambda a: a.pow(3), lambda a: a.pow(3), [(3, 4)], device)
    check(lambda a, b: a.pow(b), torch.pow, [(3, 4), (3, 4)], device, low=0.5, high=2.0)
    check(lambda a: a.neg(), torch.neg, [(5,)], device)
    check(lambda a, b: a.matmul(b), torch.matmul, [(3, 4), (4, 2)], device)
    compare(Tensor([1, 2], device=device).add(3, reverse=True), [4, 3 + 2], 0, 0)


def test_named_unary(device: str) -> None:
    check(lambda a: a.tan(), torch.tan, [(3, 4)], device, low=-1.2, high=1.2)
    check(lambda a: a.elu(), F.elu, [(3, 4)], device)
    check(lambda a: a.swish(), F.silu, [(3, 4)], device)
    check(lambda a: a.softplus(), F.softplus, [(3, 4)], device)
    x = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.7], dtype=np.float32)
    for name in ("ceil", "floor", "round"):
        compare(getattr(Tensor(x, device=device), name)(), getattr(torch, name)(torch.tensor(x)),
                0, 0, name)
    compare(Tensor(x, device=device).ceil(), np.ceil(x), 0, 0)
    compare(Tensor(x, device=device).floor(), np.floor(x), 0, 0)
    compare(Tensor(x, device=device).round(), np.round(x), 0, 0)
    half = Tensor(x, device=device).half()
    assert half.dtype == dtypes.float16
    compare(half, x.astype(np.float16), 0, 0)
