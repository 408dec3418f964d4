"""Chapter 1: Tensors — a PyTorch-like API built from the primitive ops, assembled here.

What this teaches:
- a Tensor is a handle on a lazy UOp graph plus a device; building `(a + b).relu()` computes
  nothing. `realize()`, `numpy()`, `item()` or `tolist()` schedule the graph into kernels and run
  them (chapters 6-9);
- everything — softmax, conv2d, cross-entropy, random numbers, even `arange` — is composed
  from the 29 primitive ops of ir/uop.py. No numpy call computes a result behind your back; numpy is
  only used to bring data in and take it out;
- `requires_grad`, `backward()` and `.grad` work as in PyTorch, with tinygrad's three states
  of requires_grad (chapter 2 has the rules).

The API is built in layers, one file each, and each layer is a class that uses only the ones
below it:

| part | file               | class          | what it adds                                   |
|------|--------------------|----------------|------------------------------------------------|
| 1    | tensor/core.py     | CoreTensor     | the graph, realize, primitive ops, autograd    |
| 4    | tensor/create.py   | TensorCreation | full, arange, random numbers                   |
| 5    | tensor/movement.py | TensorMovement | transpose, cat, split, gather, pad modes       |
| 6    | tensor/math.py     | TensorMath     | exp, activations, rounding, pow, sum, cumsum   |
| 7    | tensor/nn.py       | TensorNN       | matmul, conv2d, pooling, softmax, losses       |
| 3    | tensor/indexing.py | TensorIndexing | `t[...]`                                       |

Each class inherits the one above it in the table; `Tensor` below is the last, and adds
nothing: this file is where the parts meet. dtype.py is part 2.

Builds on: the parts above. Used by: nn/, engine/jit.py and every notebook.

>>> from tinyteach import Tensor
>>> a = Tensor([[1.0, 2.0], [3.0, 4.0]])
>>> (a @ a).tolist()
[[7.0, 10.0], [15.0, 22.0]]
>>> [cls.__name__ for cls in Tensor.__mro__[1:7]]
['TensorIndexing', 'TensorNN', 'TensorMath', 'TensorMovement', 'TensorCreation', 'CoreTensor']
"""
from __future__ import annotations

from tinyteach.tensor.core import (
    AUTOGRAD,
    AutogradState,
    CoreTensor,
    Scalar,
    ShapeArg,
    broadcast_shape,
)
from tinyteach.tensor.indexing import TensorIndexing

__all__ = ["Tensor", "CoreTensor", "AUTOGRAD", "AutogradState", "Scalar", "ShapeArg",
           "broadcast_shape"]


class Tensor(TensorIndexing):
    """A lazily computed n-dimensional array on a device, with reverse-mode autograd.
    Every method comes from one of the parts in the module docstring's table."""
