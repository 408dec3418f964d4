"""Chapter 1 (part 6): math — every function from five primitive ones, reductions, cumsum.

What this teaches:
- five unary primitives are enough: EXP2, LOG2, SIN, SQRT and RECIPROCAL. e^x is 2^(x / ln 2),
  cos is a shifted sin, tanh is a scaled sigmoid, and the activations (relu, gelu, silu, elu,
  softplus) are compositions of those and of `where`;
- min is max with the order turned around (-x for floats, ~x for integers), and rounding
  (trunc, floor, ceil, round half to even) comes from MOD and comparisons;
- Python's `//`, `%` and `**` have exact rules (round toward -inf, the sign of the divisor,
  integer powers by repeated squaring) that the primitives IDIV and MOD do not: they are fixed
  up here with `where`;
- reductions: sum and max are the primitive REDUCE; mean, var, std, prod, any, all, argmax and
  argmin are built on them. `cumsum` sums sliding windows, and `pool` makes sliding windows from
  movement ops alone (tensor_nn.py's convolutions and pooling use it too).

Builds on: tensor_movement.py (part 5). Used by: tensor_nn.py and everything above.

>>> from tinyteach import Tensor
>>> x = Tensor([-1.5, 0.5, 2.5])
>>> x.relu().tolist(), x.round().tolist()
([0.0, 0.5, 2.5], [-2.0, 0.0, 2.0])
>>> Tensor([1, 2, 3]).cumsum().tolist()
[1, 3, 6]
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tinyteach.dtype import DType, dtypes
from tinyteach.helpers import prod
from tinyteach.tensor_create import as_tensor
from tinyteach.tensor_movement import TensorMovement
from tinyteach.uop import Ops

if TYPE_CHECKING:
    from tinyteach.tensor import Scalar, Tensor


class TensorMath(TensorMovement):
    """Derived elementwise math, activations, rounding, reductions and cumsum (part 6)."""

    # ---- min from max: turn the order around ----

    def minimum(self, other: Any) -> Tensor:
        x, y = self._broadcasted(other)
        return x._order_reversed().maximum(y._order_reversed())._order_reversed()

    def _order_reversed(self) -> Tensor:
        """Values in the opposite order, so that min(x) = r(max(r(x))): -x for floats, and
        ~x = -x - 1 for integers and bools, which never overflows (-INT_MIN does)."""
        return -self if dtypes.is_float(self.dtype) else ~self

    # ---- math, composed from EXP2, LOG2, SIN, SQRT and RECIPROCAL ----

    def exp2(self) -> Tensor:
        return self._to_float()._unary(Ops.EXP2)

    def log2(self) -> Tensor:
        return self._to_float()._unary(Ops.LOG2)

    def exp(self) -> Tensor:
        return (self._to_float() * (1 / math.log(2))).exp2()   # e^x = 2^(x / ln 2)

    def log(self) -> Tensor:
        return self.log2() * math.log(2)                       # ln x = log2(x) * ln 2

    def sqrt(self) -> Tensor:
        return self._to_float()._unary(Ops.SQRT)

    def rsqrt(self) -> Tensor:
        return self.sqrt().reciprocal()

    def reciprocal(self) -> Tensor:
        return self._to_float()._unary(Ops.RECIPROCAL)

    def sin(self) -> Tensor:
        return self._to_float()._unary(Ops.SIN)

    def cos(self) -> Tensor:
        return ((math.pi / 2) - self._to_float()).sin()         # cos x = sin(pi/2 - x)

    def tan(self) -> Tensor:
        return self.sin() / self.cos()

    def sigmoid(self) -> Tensor:
        return (1 + (-self._to_float()).exp()).reciprocal()

    def tanh(self) -> Tensor:
        return 2.0 * (2.0 * self._to_float()).sigmoid() - 1.0

    def relu(self) -> Tensor:
        return (self > 0).where(self, 0)

    def leaky_relu(self, neg_slope: float = 0.01) -> Tensor:
        return (self < 0).where(self * neg_slope, self)

    def gelu(self) -> Tensor:
        """The tanh approximation (PyTorch's gelu(approximate='tanh'), tinygrad's gelu)."""
        inner = math.sqrt(2 / math.pi) * (self + 0.044715 * self * self * self)
        return 0.5 * self * (1 + inner.tanh())

    def silu(self) -> Tensor:
        return self * self.sigmoid()

    def swish(self) -> Tensor:
        return self.silu()

    def elu(self, alpha: float = 1.0) -> Tensor:
        return (self > 0).where(self, alpha * (self.exp() - 1))

    def softplus(self, beta: float = 1.0) -> Tensor:
        return (1 + (self * beta).exp()).log() * (1 / beta)

    def abs(self) -> Tensor:
        if self.dtype.kind in ("uint", "bool"):
            return as_tensor(self)
        return self * self.sign()  # its gradient is sign(x): 0 at x = 0, as in PyTorch

    def sign(self) -> Tensor:
        positive = (self > 0).cast(self.dtype)
        if self.dtype.kind in ("uint", "bool"):
            return positive
        return positive - (self < 0).cast(self.dtype)

    def clip(self, min_: Scalar | None = None, max_: Scalar | None = None) -> Tensor:
        if min_ is None and max_ is None:
            raise ValueError("clip needs at least one of min_ and max_")
        result = as_tensor(self) if min_ is None else self.maximum(min_)
        return result if max_ is None else result.minimum(max_)

    def clamp(self, min_: Scalar | None = None, max_: Scalar | None = None) -> Tensor:
        return self.clip(min_, max_)

    def square(self) -> Tensor:
        return self * self

    def trunc(self) -> Tensor:
        """Round toward zero: x - fmod(x, 1); huge floats are already whole numbers."""
        if not dtypes.is_float(self.dtype):
            return as_tensor(self)
        whole = self - self._binary(Ops.MOD, 1.0)
        limit = 2.0 ** {2: 10, 4: 23, 8: 52}[self.dtype.itemsize]
        return (self.abs() < limit).where(whole, self)

    def floor(self) -> Tensor:
        whole = self.trunc()
        return whole if not dtypes.is_float(self.dtype) else (self < whole).where(whole - 1, whole)

    def ceil(self) -> Tensor:
        whole = self.trunc()
        return whole if not dtypes.is_float(self.dtype) else (self > whole).where(whole + 1, whole)

    def round(self) -> Tensor:
        """Round half to even, as numpy and PyTorch do."""
        down = self.floor()
        difference = self - down
        down_is_even = (down * 0.5).floor() * 2 == down
        up = (difference > 0.5) | ((difference == 0.5) & down_is_even.logical_not())
        return up.where(down + 1, down)

    def floordiv(self, other: Any, reverse: bool = False) -> Tensor:
        """Python's //: rounds toward negative infinity."""
        x, y = self._broadcasted(other, reverse)
        if dtypes.is_float(x.dtype):
            return (x / y).floor()
        quotient = x._apply(x.uop.alu(Ops.IDIV, y.uop), x, y)
        if x.dtype.kind == "uint":
            return quotient
        inexact = x._apply(x.uop.alu(Ops.MOD, y.uop), x, y) != 0
        return (inexact & ((x < 0) != (y < 0))).where(quotient - 1, quotient)

    def mod(self, other: Any, reverse: bool = False) -> Tensor:
        """Python's %: the result takes the sign of the divisor."""
        x, y = self._broadcasted(other, reverse)
        remainder = x._apply(x.uop.alu(Ops.MOD, y.uop), x, y)
        if x.dtype.kind == "uint":
            return remainder
        wrong_sign = (remainder != 0) & ((remainder < 0) != (y < 0))
        return wrong_sign.where(remainder + y, remainder)

    def pow(self, exponent: Any, reverse: bool = False) -> Tensor:
        """x ** y. A whole-number constant exponent: repeated squaring (exact, and integers
        stay integers). Integer ** integer tensor: square and multiply over the exponent's bits
        (`_integer_tensor_power`). Anything else: 2^(y * log2|x|), with the sign fixed up."""
        if reverse:
            from tinyteach.tensor import _scalar_dtype  # (tensor.py imports this module)
            base = type(self)(exponent, self.device, dtype=_scalar_dtype(self.dtype, exponent))
            return base.pow(self)
        if isinstance(exponent, int) and not isinstance(exponent, bool):
            if not dtypes.is_float(self.dtype):
                if exponent < 0:  # numpy's rule: the answer would be a fraction
                    raise ValueError(f"integers to negative integer powers are not allowed "
                                     f"({self.dtype.name} ** {exponent}); cast to float first")
                return self._integer_power(exponent)
            if abs(exponent) <= 64:
                return self._integer_power(exponent)
        if isinstance(exponent, float) and exponent == 0.5:
            return self.sqrt()
        base, power = self._broadcasted(exponent, float_result=not (
            isinstance(exponent, type(self)) and not dtypes.is_float(self.dtype)
            and not dtypes.is_float(exponent.dtype)))
        if base.dtype == dtypes.bool:
            raise TypeError("pow of bool tensors is not supported; cast to int or float first")
        if not dtypes.is_float(base.dtype):
            return _integer_tensor_power(base, power)
        magnitude = (base.abs().log2() * power).exp2()
        odd = (power.abs() % 2) == 1
        is_whole = power.trunc() == power
        negative = base < 0
        signed = (negative & odd).where(-magnitude, magnitude)
        result = (negative & is_whole.logical_not()).where(math.nan, signed)
        return (power == 0).where(1.0, result)

    def _integer_power(self, exponent: int) -> Tensor:
        """x ** n by repeated squaring: exact for integers and negative bases."""
        if exponent < 0:
            return self._integer_power(-exponent).reciprocal()
        result: Tensor | None = None
        base = as_tensor(self)
        while exponent:
            if exponent & 1:
                result = base if result is None else result * base
            exponent >>= 1
            if exponent:
                base = base * base
        return self.ones_like() if result is None else result

    # ---- reductions: sum and max are the primitive REDUCE; the rest are built on them ----

    def sum(self, axis: Any = None, keepdim: bool = False, dtype: DType | None = None) -> Tensor:
        """Sums accumulate in at least 32 bits (half floats in float32), as in tinygrad."""
        accumulate = dtype or _sum_dtype(self.dtype)
        wide = accumulate if dtype else (dtypes.float32 if self.dtype == dtypes.float16
                                         else accumulate)
        return self.cast(wide)._reduce(Ops.ADD, axis, keepdim).cast(accumulate)

    def max(self, axis: Any = None, keepdim: bool = False) -> Tensor:
        return self._reduce(Ops.MAX, axis, keepdim)

    def min(self, axis: Any = None, keepdim: bool = False) -> Tensor:
        return self._order_reversed().max(axis, keepdim)._order_reversed()

    def mean(self, axis: Any = None, keepdim: bool = False) -> Tensor:
        total = self._to_float().sum(axis, keepdim)
        count = prod(s for i, s in enumerate(self.shape) if i in self._axes(axis))
        return total / max(count, 1) if count else total * math.nan

    def var(self, axis: Any = None, keepdim: bool = False, correction: int = 1) -> Tensor:
        centered = self._to_float() - self._to_float().mean(axis, keepdim=True)
        count = prod(s for i, s in enumerate(self.shape) if i in self._axes(axis))
        return (centered * centered).sum(axis, keepdim) / max(count - correction, 0)

    def std(self, axis: Any = None, keepdim: bool = False, correction: int = 1) -> Tensor:
        return self.var(axis, keepdim, correction).sqrt()

    def prod(self, axis: Any = None, keepdim: bool = False) -> Tensor:
        """Multiply pairs of halves until one element is left (log2(n) elementwise steps)."""
        axes = self._axes(axis)
        moved = self.permute([i for i in range(self.ndim) if i not in axes] + list(axes))
        kept = moved.shape[: self.ndim - len(axes)]
        x = moved.reshape(*kept, -1).cast(_sum_dtype(self.dtype))
        while x.shape[-1] > 1:
            half = (x.shape[-1] + 1) // 2
            x = x.pad([(0, 0)] * (x.ndim - 1) + [(0, 2 * half - x.shape[-1])], value=1)
            x = x.shrink([None] * (x.ndim - 1) + [(0, half)]) * x.shrink(
                [None] * (x.ndim - 1) + [(half, 2 * half)])
            if half > 8:
                x = x.contiguous()  # keeps each kernel small
        if x.shape[-1] == 0:
            x = type(self).ones(*kept, 1, dtype=x.dtype, device=self.device)
        result = x.reshape(kept)
        if keepdim:
            result = result.reshape(tuple(1 if i in axes else s for i, s in enumerate(self.shape)))
        return result

    def any(self, axis: Any = None, keepdim: bool = False) -> Tensor:
        return self.cast(dtypes.bool).max(axis, keepdim)

    def all(self, axis: Any = None, keepdim: bool = False) -> Tensor:
        return self.logical_not().any(axis, keepdim).logical_not()

    def argmax(self, axis: int | None = None, keepdim: bool = False) -> Tensor:
        """The index of the first maximum: max over (is_max * (n - index)), turned around."""
        if axis is None:
            index = self.flatten().argmax(0)
            return index.reshape((1,) * self.ndim) if keepdim else index
        a = self._axis(axis)
        n = self.shape[a]
        is_max = self == self.max(a, keepdim=True)
        countdown = type(self).arange(n, 0, -1, device=self.device).reshape(
            (n,) + (1,) * (self.ndim - a - 1))
        return n - (is_max.cast(dtypes.int32) * countdown).max(a, keepdim)

    def argmin(self, axis: int | None = None, keepdim: bool = False) -> Tensor:
        return self._order_reversed().argmax(axis, keepdim)

    def cumsum(self, axis: int = 0) -> Tensor:
        """Running sum: each output sums a window of the input padded with n-1 zeros."""
        if self.ndim == 0:
            return self.reshape(1).cumsum(0).reshape(())
        a = self._axis(axis)
        n = self.shape[a]
        if n == 0:
            return as_tensor(self)
        moved = self.transpose(a, -1)
        padded = moved.pad([(0, 0)] * (self.ndim - 1) + [(n - 1, 0)])
        windows = pool(padded, (n,))  # (..., n, n): window i covers inputs 0..i
        return windows.sum(-1, dtype=_sum_dtype(self.dtype)).transpose(a, -1)


def _sum_dtype(dtype: DType) -> DType:
    if dtype.kind == "bool" or (dtype.kind == "int" and dtype.itemsize < 4):
        return dtypes.int32
    if dtype.kind == "uint" and dtype.itemsize < 4:
        return dtypes.uint32
    return dtype


def _integer_tensor_power(base: Tensor, power: Tensor) -> Tensor:
    """base ** power for integer tensors of one dtype, exactly: square and multiply.

    Write the exponent in binary, power = sum of b_i * 2^i; then base ** power is the product
    of base^(2^i) over the bits b_i that are set. base^(2^i) is base squared i times, and one
    `where` per bit multiplies it in or not, so the loop runs once per bit of the dtype
    (31 for int32), whatever the values. Every multiply wraps modulo 2^bits, as numpy's
    integers do, and wrapping does not depend on the order of the multiplies, so the result
    is numpy's exactly (0 ** 0 is 1).

    A negative exponent has no integer answer. numpy raises, but a tensor's values are not
    known until it runs, so we give what C's integer division gives for 1 / base^|n|:
    1 for base 1, +-1 for base -1 (by the parity of n), and 0 for every other base, 0 too
    (tinyteach's x // 0 is 0). tinygrad 0.14 computes integer pow through floats instead.
    """
    signed = base.dtype.kind == "int"
    bits = 8 * base.dtype.itemsize - (1 if signed else 0)  # the sign bit is not a power bit
    magnitude = power.abs()  # abs(INT_MIN) wraps, but then only the parity (bit 0) matters
    result, square = base.ones_like(), base
    for bit in range(bits):
        is_set = (magnitude & (1 << bit)) != 0
        result = is_set.where(result * square, result)
        if bit < bits - 1:
            square = square * square
    if not signed:
        return result
    return ((power < 0) & (base.abs() != 1)).where(0, result)


def pool(x: Tensor, kernel: Sequence[int], stride: Sequence[int] | None = None,
         dilation: Sequence[int] | None = None) -> Tensor:
    """Sliding windows over the last len(kernel) axes, with movement ops only.
    Returns shape (..., out_1, ..., out_k, kernel_1, ..., kernel_k)."""
    k = len(kernel)
    stride = stride or (1,) * k
    dilation = dilation or (1,) * k
    leading = x.ndim - k
    for position, (size, step, spread) in enumerate(zip(kernel, stride, dilation)):
        axis = leading + 2 * position  # earlier axes have become (kernel, out) pairs
        x = _windows_1d(x, axis, size, step, spread)
    outs = [leading + 2 * i + 1 for i in range(k)]
    kernels = [leading + 2 * i for i in range(k)]
    return x.permute(list(range(leading)) + outs + kernels)


def _windows_1d(x: Tensor, axis: int, kernel: int, stride: int, dilation: int) -> Tensor:
    """Replace axis (size n) by (kernel, out): y[r, o] = x[r*dilation + o*stride].
    Trick: repeat x with rows of length L+dilation; row r then starts r*dilation later."""
    n = x.shape[axis]
    span = dilation * (kernel - 1) + 1
    if span > n:
        raise ValueError(f"window of {kernel} (dilation {dilation}) does not fit in size {n}")
    out = (n - span) // stride + 1
    length = max(n, dilation * (kernel - 1) + out * stride)
    before, after = x.shape[:axis], x.shape[axis + 1:]
    rows = -(-kernel * (length + dilation) // length)
    moved = x.pad([(0, 0)] * axis + [(0, length - n)] + [(0, 0)] * len(after))
    repeated = moved.unsqueeze(axis).expand(*before, rows, length, *after)
    flat = repeated.reshape(*before, rows * length, *after)
    diagonal = flat.shrink([None] * axis + [(0, kernel * (length + dilation))] +
                           [None] * len(after)).reshape(*before, kernel, length + dilation, *after)
    strided = diagonal.shrink([None] * (axis + 1) + [(0, out * stride)] + [None] * len(after))
    strided = strided.reshape(*before, kernel, out, stride, *after)
    picked = strided.shrink([None] * (axis + 2) + [(0, 1)] + [None] * len(after))
    return picked.reshape(*before, kernel, out, *after)

