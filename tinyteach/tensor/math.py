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
- functions with no primitive are polynomials and logs: asin from Abramowitz & Stegun's
  polynomial (a Taylor series near 0), atan and acos from asin, erf from a series and
  Numerical Recipes' erfc; a `where` that picks a branch must feed the branch it drops a safe
  input, because the gradient of an unused 1/0 is still 0 * inf = NaN;
- reductions: sum and max are the primitive REDUCE; mean, var, std, prod, any, all, argmax and
  argmin are built on them. `cumsum`, `cumprod` and `cummax` reduce prefix windows, and `pool`
  makes sliding windows from movement ops alone (tensor/nn.py's convolutions and pooling use it
  too);
- sorting is a bitonic network: log2(n)(log2(n)+1)/2 rounds of compare-and-swap between the
  two halves of a reshape, with `where` choosing.

Builds on: tensor/movement.py (part 5). Used by: tensor/nn.py and everything above.

>>> from tinyteach import Tensor
>>> x = Tensor([-1.5, 0.5, 2.5])
>>> x.relu().tolist(), x.round().tolist()
([0.0, 0.5, 2.5], [-2.0, 0.0, 2.0])
>>> Tensor([1, 2, 3]).cumsum().tolist()
[1, 3, 6]
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, Self, TypeVar

import numpy as np

from tinyteach.dtype import DType, dtypes, truncate_to
from tinyteach.helpers import prod
from tinyteach.ir.uop import Ops, UOp, sym_prod
from tinyteach.tensor.core import (
    ArgumentError,
    DTypeError,
    Scalar,
    ShapeError,
    pool,
    scalar_dtype,
    sum_acc_dtype,
    sum_dtype,
)
from tinyteach.tensor.gradient import register_gradient
from tinyteach.tensor.movement import TensorMovement
from tinyteach.tensor.multi import shards_of

TM = TypeVar("TM", bound="TensorMath")  # the helper functions return what they were given


class TensorMath(TensorMovement):
    """Derived elementwise math, activations, rounding, reductions and cumsum (part 6)."""

    # ---- a random permutation: rand (part 4), sorted (below) ----

    @classmethod
    def randperm(cls, n: int, device: str | None = None, dtype: DType | str = dtypes.int32,
                 **kwargs: Any) -> Self:
        """A random permutation of 0..n-1: the order that sorts n uniform numbers (tinygrad's;
        here in part 6, not with the other random numbers in part 4, because it needs sort).
        The sort is stable, so equal numbers keep their order, as in tinygrad."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"randperm needs a non-negative int n, got {n!r}")
        if kwargs.get("requires_grad"):
            raise TypeError("randperm gives integers, which cannot require gradients")
        if isinstance(device, (tuple, list)):  # drawn on the first device, replicated
            return cls.randperm(n, device=device[0], dtype=dtype).shard(device)
        return cls.rand(n, device=device).argsort().cast(dtypes.as_dtype(dtype))

    # ---- min from max: turn the order around ----

    def minimum(self, other: Any) -> Self:
        x, y = self._broadcasted(other)
        return x._order_reversed().maximum(y._order_reversed())._order_reversed()

    def _order_reversed(self) -> Self:
        """Values in the opposite order, so that min(x) = r(max(r(x))): -x for floats, and
        ~x = -x - 1 for integers and bools, which never overflows (-INT_MIN does)."""
        return -self if dtypes.is_float(self.dtype) else ~self

    # ---- math, composed from EXP2, LOG2, SIN, SQRT and RECIPROCAL ----

    def exp(self) -> Self:
        return (self._to_float() * (1 / math.log(2))).exp2()   # e^x = 2^(x / ln 2)

    def log(self) -> Self:
        return self.log2() * math.log(2)                       # ln x = log2(x) * ln 2

    def rsqrt(self) -> Self:
        return self.sqrt().reciprocal()

    def cos(self) -> Self:
        return ((math.pi / 2) - self._to_float()).sin()         # cos x = sin(pi/2 - x)

    def tan(self) -> Self:
        return self.sin() / self.cos()

    def sigmoid(self) -> Self:
        """1 / (1 + e^-x), from e = e^-|x| (never above 1): 1 / (1 + e) for x >= 0 and
        e / (1 + e) below. e^-x itself overflows to inf for x < -88 and its gradient, inf
        times 0, would be NaN; this way sigmoid and its gradient stay finite at +-1e4. (-|x| is
        written as a where, not abs, so that the gradient at 0 is sigmoid'(0) = 1/4.)"""
        x = self._to_float()
        positive = x >= 0
        e = positive.where(-x, x).exp()
        share = (1 + e).reciprocal()
        return positive.where(share, e * share)

    def tanh(self) -> Self:
        return 2.0 * (2.0 * self._to_float()).sigmoid() - 1.0

    def relu(self) -> Self:
        """max(x, 0) as PyTorch has it: where(x < 0, 0, x) keeps NaN (a NaN activation must not
        turn into 0 and hide a diverging run) and -0.0; zeros pass through detached, so the
        gradient at 0 is 0. (tinygrad: where(x > 0, x, 0), which maps NaN to 0.)"""
        passes = (self > 0) | (self != self)
        return (self < 0).where(0, passes.where(self, self.detach()))

    def leaky_relu(self, neg_slope: float = 0.01) -> Self:
        return (self < 0).where(self * neg_slope, self)

    def gelu(self, approximate: str = "tanh") -> Self:
        """x * Phi(x), Phi the normal distribution's CDF. By default its tanh approximation
        (tinygrad's gelu, PyTorch's gelu(approximate='tanh')); approximate="none" is the exact
        x/2 (1 + erf(x/sqrt 2)) (PyTorch's default)."""
        if approximate == "none":
            return 0.5 * self * (1 + (self * (1 / math.sqrt(2))).erf())
        if approximate != "tanh":
            raise ValueError(f"gelu approximate must be 'none' or 'tanh', not {approximate!r}")
        inner = math.sqrt(2 / math.pi) * (self + 0.044715 * self * self * self)
        return 0.5 * self * (1 + inner.tanh())

    def silu(self) -> Self:
        return self * self.sigmoid()

    def swish(self) -> Self:
        return self.silu()

    def elu(self, alpha: float = 1.0) -> Self:
        return (self > 0).where(self, alpha * (self.exp() - 1))

    def softplus(self, beta: float = 1.0, threshold: float = 20.0) -> Self:
        """log(1 + e^(beta x)) / beta; x itself where beta x > threshold (PyTorch's), where the
        two agree to float precision and exp would overflow."""
        if beta == 0:
            raise ValueError("softplus beta must not be 0")
        linear = self * beta > threshold
        smooth = (1 + (linear.where(0, self) * beta).exp()).log() * (1 / beta)
        return linear.where(self, smooth)

    def abs(self) -> Self:
        if self.dtype.kind in ("uint", "bool"):
            return self
        # max(x, -x) keeps NaN, and its gradient at 0 is a tie's two halves, 1/2 - 1/2 = 0, as in
        # PyTorch; at the tie of -0.0 and 0.0 it may give either, and + 0.0 makes it 0.0
        # (x * sign(x) gave -0.0 for -0.0)
        largest = self.maximum(-self)
        return largest + 0.0 if dtypes.is_float(self.dtype) else largest

    def sign(self) -> Self:
        positive = (self > 0).cast(self.dtype)
        if self.dtype.kind in ("uint", "bool"):
            return positive
        return _step_gradient(positive - (self < 0).cast(self.dtype), self)

    def clip(self, min_: Scalar | None = None, max_: Scalar | None = None) -> Self:
        if min_ is None and max_ is None:
            raise ArgumentError("clip needs at least one of min_ and max_")
        # where, not maximum/minimum: a value on a bound keeps its whole gradient, as
        # PyTorch's clamp (maximum splits a tie in half); min_ > max_ gives max_ everywhere
        result = self
        if min_ is not None:
            x, low = result._broadcasted(min_)
            result = (x < low).where(low, x)
        if max_ is not None:
            x, high = result._broadcasted(max_)
            result = (x > high).where(high, x)
        return result

    def clamp(self, min_: Scalar | None = None, max_: Scalar | None = None) -> Self:
        return self.clip(min_, max_)

    def square(self) -> Self:
        return self * self

    def trunc(self) -> Self:
        """Round toward zero: x - fmod(x, 1); huge floats are already whole numbers. A zero
        keeps x's sign (trunc(-0.5) is -0.0, as in PyTorch; x - fmod(x, 1) gives +0.0)."""
        if not dtypes.is_float(self.dtype):
            return self
        whole = self - self._binary(Ops.MOD, 1.0)
        whole = (whole == 0).where(self * 0.0, whole)
        limit = 2.0 ** {2: 10, 4: 23, 8: 52}[self.dtype.itemsize]
        return _step_gradient((self.abs() < limit).where(whole, self), self)

    def floor(self) -> Self:
        whole = self.trunc()
        return whole if not dtypes.is_float(self.dtype) else (self < whole).where(whole - 1, whole)

    def ceil(self) -> Self:
        whole = self.trunc()
        return whole if not dtypes.is_float(self.dtype) else (self > whole).where(whole + 1, whole)

    def round(self) -> Self:
        """Round half to even, as numpy and PyTorch do."""
        down = self.floor()
        difference = self - down
        down_is_even = (down * 0.5).floor() * 2 == down
        up = (difference > 0.5) | ((difference == 0.5) & down_is_even.logical_not())
        return up.where(down + 1, down)

    def floordiv(self, other: Any, reverse: bool = False) -> Self:
        """Python's //: rounds toward negative infinity (floats: `_floor_quotient`)."""
        x, y = self._broadcasted(other, reverse)
        if dtypes.is_float(x.dtype):
            return _step_gradient(_floor_quotient(x, y), x, y)
        quotient = x._apply(x.uop.alu(Ops.IDIV, y.uop), x, y)
        if x.dtype.kind == "uint":
            return quotient
        inexact = x._apply(x.uop.alu(Ops.MOD, y.uop), x, y) != 0
        return (inexact & ((x < 0) != (y < 0))).where(quotient - 1, quotient)

    def div(self, other: Any, reverse: bool = False, rounding_mode: str | None = None) -> Self:
        """True division (`/`): the primitive FDIV, IEEE 754's correctly rounded quotient, as
        PyTorch's; integers are divided as floats. PyTorch's `rounding_mode` rounds the quotient
        toward zero ("trunc") or down ("floor"); integers then stay integers.
        (tinygrad divides as x * (1/y), which is an ulp off for a quarter of all quotients,
        and NaN for 0 / 1e-40, since 1/1e-40 overflows to inf.)"""
        if rounding_mode == "floor":
            return self.floordiv(other, reverse)
        if rounding_mode == "trunc":
            x, y = self._broadcasted(other, reverse)
            if dtypes.is_float(x.dtype):
                return _true_quotient(x, y).trunc()  # PyTorch's: trunc(x / y)
            return x._apply(x.uop.alu(Ops.IDIV, y.uop), x, y)  # IDIV rounds toward zero, as C
        if rounding_mode is not None:
            raise ArgumentError(f"div rounding_mode must be None, 'trunc' or 'floor', "
                                f"not {rounding_mode!r}")
        x, y = self._broadcasted(other, reverse, float_result=True)
        return _true_quotient(x, y)

    def idiv(self, other: Any, reverse: bool = False) -> Self:
        """Integer division rounding toward zero, as C does (tinygrad's idiv): -5 idiv 2 is -2,
        where -5 // 2 is -3. Integer operands only."""
        x, y = self._broadcasted(other, reverse)
        if not dtypes.is_int(x.dtype):
            raise DTypeError(f"idiv needs integer operands, not {x.dtype.name}; use "
                             "div(..., rounding_mode='trunc') for floats")
        return x.div(y, rounding_mode="trunc")

    def __floordiv__(self, other: Any) -> Self:
        return self.floordiv(other)

    def __rfloordiv__(self, other: Any) -> Self:
        return self.floordiv(other, True)

    def __mod__(self, other: Any) -> Self:
        return self.mod(other)

    def __rmod__(self, other: Any) -> Self:
        return self.mod(other, True)

    def __pow__(self, other: Any) -> Self:
        return self.pow(other)

    def __rpow__(self, other: Any) -> Self:
        return self.pow(other, True)

    def mod(self, other: Any, reverse: bool = False) -> Self:
        """Python's %: the result takes the sign of the divisor."""
        x, y = self._broadcasted(other, reverse)
        remainder = x._apply(x.uop.alu(Ops.MOD, y.uop), x, y)
        if x.dtype.kind == "uint":
            return remainder
        wrong_sign = (remainder != 0) & ((remainder < 0) != (y < 0))
        return wrong_sign.where(remainder + y, remainder)

    def pow(self, exponent: Any, reverse: bool = False) -> Self:
        """x ** y. A whole-number constant exponent: repeated squaring (exact, and integers
        stay integers). Integer ** integer tensor: square and multiply over the exponent's bits
        (`_integer_tensor_power`). Anything else: 2^(y * log2|x|), with the sign fixed up."""
        if reverse:
            base = type(self)(exponent, self.device, dtype=scalar_dtype(self.dtype, exponent))
            return base.pow(self)
        if isinstance(exponent, int) and not isinstance(exponent, bool):
            if not dtypes.is_float(self.dtype):
                if exponent < 0:  # numpy's rule: the answer would be a fraction
                    raise ArgumentError(f"integers to negative integer powers are not allowed "
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
        value = _float_power(base.detach(), power.detach())
        if base.requires_grad is False and power.requires_grad is False:
            return value
        # PyTorch's gradients, not those of the graph above (which are NaN at 0 ** 0.3 and
        # 0 where x ** 0.2 of a negative x is NaN): y x^(y-1), 0 where y = 0; and
        # x^y log(x), 0 where x = 0 and y >= 0 (NaN for a negative x: (-2) ** y)
        x, y = base.detach(), power.detach()
        d_base = (y == 0).where(0.0, y * _float_power(x, y - 1))
        d_power = ((x == 0) & (y >= 0)).where(0.0, value * x.log())
        if isinstance(value.uop, UOp):  # one device: the rule is the gradient, NaN included
            result = _float_power(base, power)  # (the walk reaches base and power through it)
            register_gradient(result.uop, (base.uop, power.uop),
                              _slopes_rule(type(self), value.device, d_base, d_power))
            return result
        return _with_gradient(value, (base, d_base), (power, d_power))

    def _integer_power(self, exponent: int) -> Self:
        """x ** n by repeated squaring: exact for integers and negative bases."""
        if exponent < 0:
            return self._integer_power(-exponent).reciprocal()
        result: Self | None = None
        base = self
        while exponent:
            if exponent & 1:
                result = base if result is None else result * base
            exponent >>= 1
            if exponent:
                base = base * base
        return self.ones_like() if result is None else result

    # ---- inverse trigonometric, hyperbolic and special functions: polynomials and logs ----

    def log10(self) -> Self:
        return self.log2() * math.log10(2)                     # log10 x = log2(x) * log10(2)

    def asin(self) -> Self:
        """arcsin, odd in x, NaN outside [-1, 1]. For a = |x| >= 1/4: pi/2 - sqrt(1-a) * p(a),
        p from Abramowitz & Stegun 4.4.46 (error below 2e-8, as tinygrad); below 1/4 the
        Taylor series (the polynomial would lose digits subtracting from pi/2)."""
        sign, magnitude = self._to_float()._sign_and_magnitude()
        return sign * _asin_of_magnitude(magnitude)

    def acos(self) -> Self:
        """arccos = pi/2 - asin(x), written so that no digits are lost near x = 1 or -1:
        for |x| >= 1/4 it is sqrt(1-|x|) * p(|x|) (or pi minus that for x < 0)."""
        x = self._to_float()
        sign, magnitude = x._sign_and_magnitude()
        small = magnitude < 0.25
        near_one = (1 - magnitude).sqrt() * _polynomial(magnitude, _ASIN_COEFFICIENTS)
        from_series = math.pi / 2 - sign * _asin_series(small.where(magnitude, 0.0))
        return small.where(from_series, (x < 0).where(math.pi - near_one, near_one))

    def atan(self) -> Self:
        """arctan x = asin(x / sqrt(1 + x^2)) for |x| <= 1; above, pi/2 - atan(1/x) (with the
        sign of x), so that x^2 cannot overflow. The reciprocal never sees 0: where it is not
        used it gets 1, because a gradient through an unused 1/0 is still 0 * inf = NaN."""
        x = self._to_float()
        sign, magnitude = x._sign_and_magnitude()
        big = magnitude > 1
        inner = big.where(big.where(x, 1.0).reciprocal(), x)   # in [-1, 1]
        angle = (inner / (1 + inner * inner).sqrt()).asin()
        return big.where(sign * (math.pi / 2) - angle, angle)

    def sinh(self) -> Self:
        """(e^x - e^-x) / 2, as e^(x - ln 2) - e^(-x - ln 2) so that it overflows only where
        sinh does; for |x| < 1/2 the Taylor series (the difference would cancel digits)."""
        x = self._to_float()
        small = x.abs() < 0.5
        tiny = small.where(x, 0.0)
        series = tiny * _polynomial(tiny * tiny, [1 / 362880, 1 / 5040, 1 / 120, 1 / 6, 1.0])
        return small.where(series, (x - math.log(2)).exp() - (-x - math.log(2)).exp())

    def cosh(self) -> Self:
        x = self._to_float()
        return (x - math.log(2)).exp() + (-x - math.log(2)).exp()   # (e^x + e^-x) / 2

    def atanh(self) -> Self:
        """(log(1 + x) - log(1 - x)) / 2, with an accurate log1p: +-inf at +-1, NaN beyond."""
        x = self._to_float()
        # |x| > 1: NaN, but the gradient 1 / (1 - x^2) is a number there, as in PyTorch;
        # log((1 + x) / (1 - x)) / 2 gives both (each branch sees only inputs of its own)
        outside = x.abs() > 1
        inside = outside.where(0.0, x)
        beyond = outside.where(x, 2.0)
        return outside.where(((1 + beyond) / (1 - beyond)).log() * 0.5,
                             (_log1p(inside) - _log1p(-inside)) * 0.5)

    def asinh(self) -> Self:
        """log(x + sqrt(x^2 + 1)), odd in x. For a = |x|: log1p(a + a^2 / (1 + sqrt(1 + a^2)))
        (sqrt(1 + a^2) - 1 rewritten so that small a keeps its digits); above 2^12,
        log(2a), so that a^2 cannot overflow (the error there is below 1e-8)."""
        sign, magnitude = self._to_float()._sign_and_magnitude()
        huge = magnitude > 4096
        a = huge.where(0.0, magnitude)
        moderate = _log1p(a + a * a / (1 + (1 + a * a).sqrt()))
        return sign * huge.where(huge.where(magnitude, 1.0).log() + math.log(2), moderate)

    def acosh(self) -> Self:
        """log(x + sqrt(x^2 - 1)) for x >= 1 (NaN below, from the square root of x - 1):
        log1p((x-1) + sqrt(x-1) sqrt(x+1)) keeps the digits near 1; above 2^12, log(2x), so
        that x^2 cannot overflow."""
        x = self._to_float()
        huge = x > 4096
        # below 1: NaN, but for x < -1 the gradient 1 / sqrt(x^2 - 1) is a number, as in
        # PyTorch; log(x + sqrt(x^2 - 1)) gives both
        below = x < 1
        y = (huge | below).where(2.0, x)
        moderate = _log1p((y - 1) + (y - 1).sqrt() * (y + 1).sqrt())
        z = below.where(x, -2.0)
        negative = (z + (z * z - 1).sqrt()).log()
        large = huge.where(huge.where(x, 1.0).log() + math.log(2), moderate)
        # (below -2^12, z*z overflows and the log would give inf: the value is NaN there, and
        # PyTorch's gradient, -1/sqrt(x^2 - 1), is below 2.5e-4)
        negative = (x < -4096).where(math.nan, negative)
        return below.where(negative, large)

    def erf(self) -> Self:
        """The error function, odd in x. Below |x| = 1/2 its Taylor series; above,
        1 - erfc(|x|) with Numerical Recipes' erfcc (relative error below 1.2e-7).
        (tinygrad uses Abramowitz & Stegun 7.1.26, error 1.5e-7 absolute.)"""
        sign, magnitude = self._to_float()._sign_and_magnitude()
        small = magnitude < 0.5
        x = small.where(magnitude, 0.0)
        series = x * _polynomial(x * x, _ERF_SERIES) * (2 / math.sqrt(math.pi))
        z = small.where(1.0, magnitude).minimum(10.0)  # erfc(10) is 0 in float32
        t = (1 + 0.5 * z).reciprocal()
        erfc = t * (_polynomial(t, _ERFC_COEFFICIENTS) - z * z).exp()
        return sign * small.where(series, 1 - erfc)

    def _sign_and_magnitude(self) -> tuple[Self, Self]:
        """(-1 or 1, |x|) for an odd function f(x) = sign * f(|x|). |x| is where(x < 0, -x, x),
        whose gradient at 0 is 1 (abs's is 0), so f'(0) comes out right."""
        negative = self < 0
        return negative.where(-1.0, 1.0).cast(self.dtype), negative.where(-self, self)

    # ---- testing values: inf and NaN ----

    def isinf(self, detect_positive: bool = True, detect_negative: bool = True) -> Self:
        """True where the value is +inf (if detect_positive) or -inf (if detect_negative)."""
        never = self.full_like(False, dtype=dtypes.bool)
        if not dtypes.is_float(self.dtype):
            return never
        positive = (self == math.inf) if detect_positive else never
        return (positive | (self == -math.inf)) if detect_negative else positive

    def isnan(self) -> Self:
        """NaN is the only value that is not equal to itself."""
        return self != self

    def isfinite(self) -> Self:
        return (self.isinf() | self.isnan()).logical_not()

    # ---- more activations (tinygrad's names and signatures, PyTorch's numbers) ----

    def leakyrelu(self, neg_slope: float = 0.01) -> Self:
        """tinygrad's name for leaky_relu."""
        return self.leaky_relu(neg_slope)

    def celu(self, alpha: float = 1.0) -> Self:
        """max(0, x) + min(0, alpha * (e^(x/alpha) - 1))."""
        if alpha == 0:
            raise ValueError("celu: alpha must not be 0 (it divides x)")
        return self.maximum(0) + (alpha * (self.minimum(0) / alpha).exp() - alpha).minimum(0)

    def selu(self, alpha: float = 1.6732632423543772, gamma: float = 1.0507009873554805) -> Self:
        """gamma * (x if x > 0 else alpha * (e^x - 1)). (tinygrad's defaults are these
        constants rounded to 1.67326 and 1.0507; these are PyTorch's.)"""
        return gamma * (self > 0).where(self, alpha * (self.minimum(0).exp() - 1))

    def relu6(self) -> Self:
        return self.clip(0, 6)

    def hardsigmoid(self, alpha: float = 1 / 6, beta: float = 0.5) -> Self:
        """max(0, min(1, alpha * x + beta)); the defaults are PyTorch's relu6(x + 3) / 6."""
        return (alpha * self + beta).clip(0, 1)

    def hardswish(self) -> Self:
        return self * (self + 3).relu6() * (1 / 6)

    def hardtanh(self, min_val: float = -1, max_val: float = 1) -> Self:
        if min_val > max_val:
            raise ValueError(f"hardtanh: min_val {min_val} is above max_val {max_val}")
        return self.clip(min_val, max_val)

    def quick_gelu(self) -> Self:
        return self * (self * 1.702).sigmoid()                 # gelu's sigmoid approximation

    def mish(self) -> Self:
        """x * tanh(softplus(x)), with softplus written so that e^x cannot overflow."""
        return self * _stable_softplus(self._to_float()).tanh()

    def softsign(self) -> Self:
        return self / (1 + self.abs())

    def logsigmoid(self) -> Self:
        """log(sigmoid(x)) = min(x, 0) - log1p(e^-|x|): no overflow, no log(0)."""
        x = self._to_float()
        return x.minimum(0) - _log1p((-x.abs()).exp())

    def lerp(self, end: Self, weight: Self | float) -> Self:
        """self + (end - self) * weight: linear interpolation from self (0) to end (1)."""
        return self + (end - self) * weight

    # ---- binary functions of two tensors ----

    def fmod(self, other: Any) -> Self:
        """C's fmod (torch.fmod): the remainder of x / y truncated, with the sign of x (Python's
        % takes the divisor's). The value is the primitive MOD; its gradient (1 for x,
        -trunc(x / y) for y) is added as a term that is exactly zero in the forward pass."""
        x, y = self._broadcasted(other)
        remainder = x._apply(x.uop.alu(Ops.MOD, y.uop), x, y)
        if not dtypes.is_float(x.dtype):
            return remainder
        remainder = (y == 0).where(math.nan, remainder)  # C's; the NUMPY device's MOD gives 0
        quotient = (x / y).trunc().detach()
        quotient = quotient.isfinite().where(quotient, 0.0)
        # the gradient term is made +0.0 whatever its signs, then subtracted: r - (+0.0) keeps
        # the sign of a zero remainder (fmod(-4, 2) is -0.0), where r + 0.0 would give +0.0
        gradient = _zero_with_gradient(-x) + quotient * _zero_with_gradient(y) + 0.0
        return remainder - gradient

    def copysign(self, other: Any) -> Self:
        """|x| with the sign of `other` (a float result, as in PyTorch). The sign is `other`'s
        sign bit, read through a bitcast: -0.0 and a NaN's sign count, as in PyTorch and C
        (no comparison sees the sign of a NaN)."""
        x, y = self._broadcasted(other, float_result=True)
        negative = y.bitcast(_SIGNED[y.dtype.itemsize]) < 0
        return negative.where(-x.abs(), x.abs())

    def logaddexp(self, other: Any) -> Self:
        """log(e^x + e^y) = m + log(e^(x-m) + e^(y-m)) with m = max(x, y) (detached: the
        result does not depend on it), and m = 0 where it is infinite, so -inf, -inf gives
        -inf and inf gives inf, not NaN."""
        x, y = self._broadcasted(other, float_result=True)
        peak = x.maximum(y).detach()
        peak = peak.isinf().where(0.0, peak)
        return peak + ((x - peak).exp() + (y - peak).exp()).log()

    # ---- bitwise operations: integers and bools only ----

    def bitwise_and(self, other: Any, reverse: bool = False) -> Self:
        self._check_bitwise("bitwise_and", other)
        return self._binary(Ops.AND, other, reverse)

    def bitwise_or(self, other: Any, reverse: bool = False) -> Self:
        self._check_bitwise("bitwise_or", other)
        return self._binary(Ops.OR, other, reverse)

    def bitwise_xor(self, other: Any, reverse: bool = False) -> Self:
        self._check_bitwise("bitwise_xor", other)
        return self._binary(Ops.XOR, other, reverse)

    def xor(self, other: Any, reverse: bool = False) -> Self:
        """tinygrad's name for bitwise_xor."""
        return self.bitwise_xor(other, reverse)

    def bitwise_not(self) -> Self:
        self._check_bitwise("bitwise_not")
        return ~self

    def lshift(self, shift: Any) -> Self:
        """x << n = x * 2^n, wrapping as the integers do (n may be an integer tensor)."""
        self._check_bitwise("lshift", shift)
        return self * self._power_of_two("lshift", shift)

    def rshift(self, shift: Any) -> Self:
        """x >> n = floor(x / 2^n): an arithmetic shift, as PyTorch's for negative x."""
        self._check_bitwise("rshift", shift)
        bits = 8 * self.dtype.itemsize
        if isinstance(shift, int) and self.dtype.kind == "int" and shift == bits - 1:
            return (self < 0).where(-1, 0).cast(self.dtype)    # 2^(bits-1) does not fit
        return self // self._power_of_two("rshift", shift)

    def __lshift__(self, shift: Any) -> Self:
        return self.lshift(shift)

    def __rshift__(self, shift: Any) -> Self:
        return self.rshift(shift)

    def __rlshift__(self, value: Any) -> Self:  # 1 << t
        self._check_bitwise("lshift", value)
        return self.full_like(value).lshift(self)

    def __rrshift__(self, value: Any) -> Self:  # 256 >> t
        self._check_bitwise("rshift", value)
        return self.full_like(value).rshift(self)

    def _power_of_two(self, name: str, shift: Any) -> Any:
        """2^shift, for a constant (checked against the dtype's width) or an integer tensor."""
        bits = 8 * self.dtype.itemsize
        if isinstance(shift, int):
            if not 0 <= shift < bits:
                raise ValueError(f"{name}: shift {shift} is outside [0, {bits}) for "
                                 f"{self.dtype.name}")
            return 1 << shift if shift < bits - 1 or self.dtype.kind == "uint" else -(1 << shift)
        return self.full_like(2).pow(shift.cast(self.dtype))

    def _check_bitwise(self, name: str, *others: Any) -> None:
        for value in (self, *others):
            dtype = value.dtype if hasattr(value, "dtype") else dtypes.from_py(value)
            if dtypes.is_float(dtype):
                raise DTypeError(f"{name} needs integer or bool operands, not {dtype.name}")
            if name in ("lshift", "rshift") and dtype == dtypes.bool:
                raise DTypeError(f"{name} needs integer operands, not bool")

    # ---- bitcast: the same bits, read as another dtype ----

    def bitcast(self, dtype: DType | str) -> Self:
        """The same bits read as another dtype of the same size (numpy's `view`): float32 1.0
        is int32 1065353216. One node, a CAST whose arg is BITCAST (ir/uop.py), which every device
        computes by reinterpreting the bits, never with arithmetic: each float16, bfloat16,
        float32 and float64 bit pattern reads back as it was, subnormals, -0.0, infinities and
        NaN payloads (quiet or signaling) included. Integers of one size reinterpret by a
        wrapping cast, which keeps the bits too. No gradient, as in tinygrad.

        Where not bit for bit: WGSL cannot bitcast a half float, so WEBGPU converts it through
        f32 (exact for every value); lavapipe keeps every NaN payload that way, except that a
        bitcast of a constant to a signaling half NaN comes back quiet (its compiler folds
        the conversion). tests/test_bitcast_bits.py shows what each device does."""
        wanted = dtypes.as_dtype(dtype)
        if dtypes.bool in (wanted, self.dtype):
            raise TypeError(f"bitcast between bool and {self.dtype.name}/{wanted.name} is "
                            f"not supported")
        if wanted.itemsize != self.dtype.itemsize:
            raise ValueError(f"bitcast needs a dtype of the same size: {self.dtype.name} has "
                             f"{self.dtype.itemsize} bytes, {wanted.name} {wanted.itemsize}")
        x = self.detach()
        if wanted == x.dtype:
            return x
        if dtypes.is_int(x.dtype) and dtypes.is_int(wanted):
            return x.cast(wanted)  # int8 <-> uint8, ...: a wrapping cast keeps the bits
        return x._apply(x.uop.bitcast(wanted), x)

    # ---- reductions: sum and max are the primitive REDUCE; the rest are built on them ----

    def min(self, axis: Any = None, keepdim: bool = False) -> Self:
        return self._order_reversed().max(axis, keepdim)._order_reversed()

    def mean(self, axis: Any = None, keepdim: bool = False,
             dtype: DType | str | type | None = None) -> Self:
        """Integers are averaged in the default float; `dtype` (a float) casts the input first."""
        if dtype is not None:
            wanted = dtypes.as_dtype(dtype)
            if not dtypes.is_float(wanted):
                raise TypeError(f"mean needs a float dtype, got {wanted.name}")
            return self.cast(wanted).mean(axis, keepdim)
        values = self._to_float()
        # half and bfloat16 are summed and divided in float32 and rounded once at the end, as
        # PyTorch and tinygrad do (a half sum divided in half rounds twice)
        total = values.cast(sum_acc_dtype(values.dtype)).sum(axis, keepdim)
        count = sym_prod(s for i, s in enumerate(self.shape) if i in self._axes(axis))
        if isinstance(count, UOp):  # a symbolic count: divided by its value at each run
            return (total / count).cast(values.dtype)
        mean = total / max(count, 1) if count else total * math.nan
        return mean.cast(values.dtype)

    def var(self, axis: Any = None, keepdim: bool = False, correction: int = 1) -> Self:
        centered = self._to_float() - self._to_float().mean(axis, keepdim=True)
        count = prod(s for i, s in enumerate(self.shape) if i in self._axes(axis))
        return (centered * centered).sum(axis, keepdim) / max(count - correction, 0)

    def std(self, axis: Any = None, keepdim: bool = False, correction: int = 1) -> Self:
        return self.var(axis, keepdim, correction).sqrt()

    def prod(self, axis: Any = None, keepdim: bool = False,
             dtype: DType | str | type | None = None) -> Self:
        """Multiply pairs of halves until one element is left (log2(n) elementwise steps).
        `dtype` casts the input first (PyTorch's)."""
        if dtype is not None:
            return self.cast(dtypes.as_dtype(dtype)).prod(axis, keepdim)
        axes = self._axes(axis)
        if self.ndim == 0:  # the product of one number (axis 0 or -1 of a 0-d tensor)
            return self.cast(sum_dtype(self.dtype))
        moved = self.permute([i for i in range(self.ndim) if i not in axes] + list(axes))
        kept = moved.shape[: self.ndim - len(axes)]
        x = moved.reshape(*kept, -1).cast(sum_dtype(self.dtype))
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

    def any(self, axis: Any = None, keepdim: bool = False) -> Self:
        return self.cast(dtypes.bool).max(axis, keepdim)

    def all(self, axis: Any = None, keepdim: bool = False) -> Self:
        return self.logical_not().any(axis, keepdim).logical_not()

    def argmax(self, axis: int | None = None, keepdim: bool = False) -> Self:
        """The index of the first maximum: max over (is_max * (n - index)), turned around."""
        if axis is None:
            index = self.flatten().argmax(0)
            return index.reshape((1,) * self.ndim) if keepdim else index
        a = self._axis(axis)
        n = self.shape[a]
        # a NaN is the maximum (max propagates it) and PyTorch returns the first NaN's index;
        # `x == NaN` is False, so NaNs are found with `x != x`
        is_max = (self == self.max(a, keepdim=True)) | (self != self)
        countdown = type(self).arange(n, 0, -1, device=self.device).reshape(
            (n,) + (1,) * (self.ndim - a - 1))
        return n - (is_max.cast(dtypes.int32) * countdown).max(a, keepdim)

    def argmin(self, axis: int | None = None, keepdim: bool = False) -> Self:
        return self._order_reversed().argmax(axis, keepdim)

    def cumsum(self, axis: int = 0) -> Self:
        """Running sum: each output sums a window of the input padded with n-1 zeros."""
        return self._cumulative(axis, "sum")

    def cumprod(self, axis: int = 0) -> Self:
        """Running product: the windows of cumsum, padded with ones, multiplied out by `prod`
        (pairs of halves, so a zero anywhere gives the right gradient, unlike exp(sum(log)))."""
        return self._cumulative(axis, "prod")

    def _cumulative(self, axis: int, reduction: str) -> Self:
        if self.ndim == 0:
            self._axis(axis)  # a 0-d tensor has axis 0 (and -1) only
            return self.reshape(1)._cumulative(0, reduction).reshape(())
        a = self._axis(axis)
        if self.shape[a] == 0:
            return self
        fill = 1 if reduction == "prod" else 0
        windows = self._prefix_windows(a, fill)
        if reduction == "prod":
            return windows.prod(-1).transpose(a, -1)
        return windows.sum(-1, dtype=sum_dtype(self.dtype)).transpose(a, -1)

    def _prefix_windows(self, axis: int, fill: Scalar) -> Self:
        """(..., n, n) with `axis` moved last: window i holds inputs 0..i, after n-1-i `fill`s."""
        n = self.shape[axis]
        moved = self.transpose(axis, -1)
        padded = moved.pad([(0, 0)] * (self.ndim - 1) + [(n - 1, 0)], value=fill)
        return pool(padded, (n,))

    def cummax(self, axis: int = 0) -> tuple[Self, Self]:
        """Running max and where it was reached, as PyTorch's (values, indices): the last
        index of a tie; once a NaN is seen the values are NaN and the index is the latest NaN's."""
        if self.ndim == 0:
            self._axis(axis)
            values, indices = self.reshape(1).cummax(0)
            return values.reshape(()), indices.reshape(())
        a = self._axis(axis)
        n = self.shape[a]
        if n == 0:
            return self, self.zeros_like(dtype=dtypes.int32)
        windows = self._prefix_windows(a, self.dtype.min)
        # the input index of each window position (-1 in the padding)
        index = type(self).arange(n, device=self.device).pad([(n - 1, 0)], value=-1)
        index = pool(index, (n,))
        values = windows.max(-1, keepdim=True)
        last = (windows == values).where(index, -1).max(-1)
        values = values.squeeze(-1)
        if dtypes.is_float(self.dtype):
            is_nan = windows.isnan()
            last_nan = is_nan.where(index, -1).max(-1)
            seen = is_nan.any(-1)
            values, last = seen.where(math.nan, values), seen.where(last_nan, last)
        return values.transpose(a, -1), last.transpose(a, -1)

    def cummin(self, axis: int = 0) -> tuple[Self, Self]:
        """Running min and its indices: cummax of the values in reversed order."""
        values, indices = self._order_reversed().cummax(axis)
        return values._order_reversed(), indices

    def unfold(self, dim: int, size: int, step: int) -> Self:
        """Windows of `size` elements every `step` along dim (PyTorch's Tensor.unfold): dim
        becomes the number of windows and a last axis of length `size` is added."""
        if size < 0 or step < 1:
            raise ArgumentError(f"unfold needs size >= 0 and step >= 1, got size={size}, "
                             f"step={step}")
        a = self._axis(dim)
        if size > (self.shape[a] if self.ndim else 1):
            raise ShapeError(f"unfold: size {size} is larger than dim {a} of shape {self.shape}")
        if self.ndim == 0:
            return self.reshape(1).unfold(0, size, step).reshape(-1)
        windows = pool(self.transpose(a, -1), (size,), (step,))   # (..., out, size)
        return windows.transpose(a, -2)

    # ---- closeness, and statistics in pairs ----

    def isclose(self, other: Any, rtol: float = 1e-05, atol: float = 1e-08,
                equal_nan: bool = False) -> Self:
        """|x - y| <= atol + rtol * |y| (PyTorch's and numpy's rule, not symmetric in x, y);
        infinities are close only to themselves, NaN to NaN only if equal_nan."""
        x, y = self._broadcasted(other, float_result=True)
        near = (x - y).abs() <= atol + rtol * y.abs()
        close = (x == y) | (x.isfinite() & y.isfinite() & near)
        return (close | (x.isnan() & y.isnan())) if equal_nan else close

    def allclose(self, other: Any, rtol: float = 1e-05, atol: float = 1e-08,
                 equal_nan: bool = False) -> bool:
        """isclose everywhere, as a Python bool (this computes the tensors)."""
        return bool(self.isclose(other, rtol, atol, equal_nan).all().item())

    def var_mean(self, axis: Any = None, keepdim: bool = False,
                 correction: int = 1) -> tuple[Self, Self]:
        return self.var(axis, keepdim, correction), self.mean(axis, keepdim)

    def std_mean(self, axis: Any = None, keepdim: bool = False,
                 correction: int = 1) -> tuple[Self, Self]:
        return self.std(axis, keepdim, correction), self.mean(axis, keepdim)

    # ---- sorting: a bitonic network of compare-and-swap steps over views ----

    def sort(self, dim: int = -1, descending: bool = False) -> tuple[Self, Self]:
        """(values, indices) sorted along dim, stably (ties keep their order), NaN last when
        ascending and first when descending, as PyTorch's sort(stable=True).

        A bitonic sorting network (Batcher's), in the form with no directions: pad the axis to
        m = 2^p elements; then for each block size k = 2, 4, ..., m, first compare element i
        of each block with its mirror image k-1-i, then, for each distance j = k/4, ..., 1,
        element i with i + j (i in the first half of a block of 2j), and swap every pair that
        is out of order. A pair is two views of one reshape, (m/2j, 2, j), the mirror a flip
        of the second view, so every step is movement ops, comparisons and `where`: p(p+1)/2
        steps, each one kernel (`contiguous`: an unrealized step would recompute the steps
        before it twice over), and the steps with one j share a compiled kernel. The indices
        travel with the values, and the gradient flows through the `where`s to the element
        each output came from."""
        if self.ndim == 0:
            values, indices = self.reshape(1).sort(0, descending)
            return values.reshape(()), indices.reshape(())
        a = self._axis(dim)
        n = self.shape[a]
        moved = self.transpose(a, -1)
        index = type(self).arange(n, device=self.device).reshape(
            (1,) * (self.ndim - 1) + (n,)).expand(moved.shape)
        if n <= 1:
            return self, index.transpose(a, -1)
        size = 1 << (n - 1).bit_length()
        pad = [(0, 0)] * (self.ndim - 1) + [(0, size - n)]
        values, index = moved.pad(pad), index.pad(pad, value=size)  # index >= n: padding
        k = 2
        while k <= size:
            values, index = _compare_and_swap(values, index, n, k // 2, True, descending)
            j = k // 4
            while j >= 1:
                values, index = _compare_and_swap(values, index, n, j, False, descending)
                j //= 2
            k *= 2
        keep = [None] * (self.ndim - 1) + [(0, n)]
        return values.shrink(keep).transpose(a, -1), index.shrink(keep).transpose(a, -1)

    def argsort(self, dim: int = -1, descending: bool = False) -> Self:
        """The indices that sort the tensor along dim (sort's second result)."""
        return self.sort(dim, descending)[1]

    def topk(self, k: int, dim: int = -1, largest: bool = True,
             sorted_: bool = True) -> tuple[Self, Self]:
        """The k largest (or smallest) values along dim and their indices, largest first
        (always sorted: sorted_=False is allowed to be sorted too). NaN counts as largest."""
        a = self._axis(dim)
        n = self.shape[a] if self.ndim else 1
        if not 0 <= k <= n:
            raise ArgumentError(f"topk: k={k} is outside [0, {n}] for dim {a} of shape "
                             f"{self.shape}")
        values, indices = self.sort(a, descending=largest)
        if self.ndim == 0:
            return values, indices
        keep: list[tuple[int, int] | None] = [None] * self.ndim
        keep[a] = (0, k)
        return values.shrink(keep), indices.shrink(keep)

# Abramowitz & Stegun 4.4.46: asin(a) = pi/2 - sqrt(1 - a) * p(a) on [0, 1], highest power first
_ASIN_COEFFICIENTS = [-0.0012624911, 0.0066700901, -0.0170881256, 0.0308918810, -0.0501743046,
                      0.0889789874, -0.2145988016, 1.5707963050]
# asin(a) = a * sum of c_k a^(2k): (2k)! / (4^k (k!)^2 (2k+1)), highest first
_ASIN_SERIES = [35 / 1152, 5 / 112, 3 / 40, 1 / 6, 1.0]
# erf(x) = 2/sqrt(pi) * x * sum of (-1)^n x^(2n) / (n! (2n+1)), highest first
_ERF_SERIES = [1 / 9360, -1 / 1320, 1 / 216, -1 / 42, 1 / 10, -1 / 3, 1.0]
# Numerical Recipes' erfcc: erfc(z) = t * exp(-z^2 + q(t)), t = 1 / (1 + z/2), highest first
_ERFC_COEFFICIENTS = [0.17087277, -0.82215223, 1.48851587, -1.13520398, 0.27886807, -0.18628806,
                      0.09678418, 0.37409196, 1.00002368, -1.26551223]


def _polynomial(x: TM, coefficients: Sequence[float]) -> TM:
    """c0 x^n + c1 x^(n-1) + ... + cn by Horner's rule: n multiplies and n adds."""
    result = x * coefficients[0] + coefficients[1]
    for c in coefficients[2:]:
        result = result * x + c
    return result


def _asin_series(a: TM) -> TM:
    """asin by its Taylor series: 5 terms are exact to float32 for |a| < 1/4."""
    return a * _polynomial(a * a, _ASIN_SERIES)


def _asin_of_magnitude(a: TM) -> TM:
    """asin(a) for a = |x| >= 0: the series below 1/4, A&S 4.4.46 above."""
    small = a < 0.25
    near_one = math.pi / 2 - (1 - a).sqrt() * _polynomial(a, _ASIN_COEFFICIENTS)
    return small.where(_asin_series(small.where(a, 0.0)), near_one)


def _log1p(u: TM) -> TM:
    """log(1 + u) without losing the digits of a small u: with w = 1 + u rounded,
    log(w) * u / (w - 1) corrects for the rounding (Goldberg's trick); u itself where w is 1,
    inf where w is inf. The divisor is never 0, not even where its result is not used."""
    w = 1 + u
    exact = w == 1
    ratio = (w == math.inf).where(1.0, u / exact.where(1.0, w - 1))
    return exact.where(u, w.log() * ratio)


def _stable_softplus(x: TM) -> TM:
    """log(1 + e^x) = max(x, 0) + log1p(e^-|x|): e^x cannot overflow."""
    return x.maximum(0) + _log1p((-x.abs()).exp())


def _true_quotient(x: TM, y: TM) -> TM:
    """x / y for floats of one shape: FDIV, except by a constant power of two whose reciprocal
    is a float too (`x / 2`, a mean over 1024 values), where x * 2^-k is the same number bit
    for bit (both round the same exact quotient once) and a multiply is cheaper."""
    reciprocal = _exact_reciprocal(y)
    if reciprocal is not None:
        return x * reciprocal
    return x._apply(x.uop.alu(Ops.FDIV, y.uop), x, y)


def _exact_reciprocal(y: TM) -> float | None:
    """1/c if y is a constant c (without a gradient) that is a power of two whose reciprocal
    is exactly representable in y's dtype, else None."""
    node = shards_of(y.uop)[0]  # (a replicated constant is the same on every device)
    while node.op in (Ops.RESHAPE, Ops.EXPAND):
        node = node.src[0]
    if y.requires_grad or node.op is not Ops.CONST or not math.isfinite(node.arg) or \
            node.arg == 0:
        return None
    mantissa, _ = math.frexp(node.arg)
    reciprocal = truncate_to(y.dtype, 1.0 / node.arg)
    exact = abs(mantissa) == 0.5 and reciprocal * node.arg == 1.0
    return float(reciprocal) if exact else None


def _floor_quotient(x: TM, y: TM) -> TM:
    """floor(x / y) for floats as PyTorch computes it (c10::div_floor_floating): from the
    exact multiple of y below x, (x - fmod(x, y)) / y, not from the rounded quotient, which
    can round up to the next integer (1 // 0.1 is 9, while floor(1 / 0.1) = 10); a zero keeps
    the quotient's sign, and y = 0 gives x / y itself (+-inf or NaN)."""
    quotient = _true_quotient(x, y)
    remainder = x._apply(x.uop.alu(Ops.MOD, y.uop), x, y)  # C's fmod
    # fmod(x, +-inf) is x; WGSL's % is x - y * trunc(x / y), NaN there
    remainder = (y.isinf() & x.isfinite()).where(x, remainder)
    multiple = _true_quotient(x - remainder, y)
    below = (remainder != 0) & ((y < 0) != (remainder < 0))
    multiple = below.where(multiple - 1, multiple)
    floored = multiple.floor()
    floored = (multiple - floored > 0.5).where(floored + 1, floored)
    negative = (quotient < 0) | (quotient.reciprocal() < 0)   # -0.0 included
    zero = negative.where(-0.0, 0.0)
    return (y == 0).where(quotient, (multiple != 0).where(floored, zero))


def _step_gradient(value: TM, *sources: TM) -> TM:
    """`value`, a step function of `sources` (sign, trunc, floor division and the roundings
    built on them), with the gradient PyTorch gives it: 0 for each source, where the graph
    alone would give 1 (x - fmod(x, 1)) or no gradient at all (comparisons). Costs nothing
    when no gradient is wanted. The zero is +0.0 and subtracted, so a -0.0 keeps its sign."""
    wanting = [source for source in sources if source.requires_grad]
    if not wanting:
        return value
    zero = _zero_with_gradient(wanting[0]) * 0.0
    for source in wanting[1:]:
        zero = zero + _zero_with_gradient(source) * 0.0
    return value.detach() - (zero + 0.0)


def _float_power(base: TM, power: TM) -> TM:
    """x ** y for floats: 2^(y * log2|x|), with the sign of an odd whole power, NaN for a
    negative base to a fractional power (but C's inf or 0 for -inf), and 1 for y = 0 (even
    0 ** 0 and NaN ** 0)."""
    magnitude = (base.abs().log2() * power).exp2()
    odd = (power.abs() % 2) == 1
    is_whole = power.trunc() == power
    negative = base < 0
    signed = (negative & odd).where(-magnitude, magnitude)
    undefined = negative & is_whole.logical_not() & (base != -math.inf)
    result = undefined.where(math.nan, signed)
    return (power == 0).where(1.0, result)


def _slopes_rule(cls: type, device: Any, *slopes: TM) -> Callable[..., tuple[UOp, ...]]:
    """A gradient rule (gradient.register_gradient) for a result whose derivative by each
    input is a known tensor: the result's gradient times that slope, input by input."""
    def rule(grad: UOp, *inputs: UOp) -> tuple[UOp, ...]:
        upstream = cls(grad, device)
        return tuple((upstream * slope).cast(source.dtype).uop
                     for slope, source in zip(slopes, inputs))
    return rule


def _with_gradient(value: TM, *pairs: tuple[TM, TM]) -> TM:
    """`value` in the forward pass; the gradient `slope` (a detached tensor) for each
    (source, slope). Each slope multiplies a 0 that carries its source's gradient; an
    infinite slope is split into two halves of the largest float (0 * inf would be NaN in
    the forward pass), and a NaN slope where `value` is a number becomes 0. (A source that
    is itself infinite gets no gradient: see _zero_with_gradient.)"""
    result = value.detach()
    shows_nan = value.isnan()  # there any slope may show: the forward pass is NaN already
    largest = float(np.finfo(value.dtype.np).max)
    for source, slope in pairs:
        if source.requires_grad is False:
            continue
        slope = shows_nan.where(slope, slope.isnan().where(0.0, slope))
        half = slope * 0.5
        half = shows_nan.where(half, (half > largest).where(largest, half))
        half = shows_nan.where(half, (half < -largest).where(-largest, half))
        carrier = _zero_with_gradient(source)
        result = result + carrier * half + carrier * half
    return result


def _zero_with_gradient(x: TM) -> TM:
    """0 in the forward pass, with the gradient of x: x - detach(x) (0 too where x is not
    finite, where the difference would be NaN)."""
    return x.isfinite().where(x - x.detach(), 0.0)

def _sort_key(values: TM, index: TM, n: int, descending: bool) -> tuple[TM, TM]:
    """A total order for sort, as (class, key), compared before the index: class 0 for
    ordinary values, 1 for NaN (0 when descending, so NaN comes first, as PyTorch's), 2 for
    padding; key is the value (reversed when descending) and 0 for NaN and padding."""
    x = values.cast(dtypes.int32) if values.dtype == dtypes.bool else values
    is_nan = x.isnan()
    is_pad = index >= n
    ordinary = 1 if descending else 0
    group = is_pad.where(2, is_nan.where(1 - ordinary, ordinary))
    key = x._order_reversed() if descending else x
    return group, (is_nan | is_pad).where(0, key)


def _comes_after(a: tuple[TM, TM, TM], b: tuple[TM, TM, TM]) -> TM:
    """(group, key, index) of a > that of b, lexicographically: the pair is out of order."""
    (group_a, key_a, index_a), (group_b, key_b, index_b) = a, b
    later = (key_a > key_b) | ((key_a == key_b) & (index_a > index_b))
    return (group_a > group_b) | ((group_a == group_b) & later)


def _compare_and_swap(values: TM, index: TM, n: int, j: int, mirror: bool,
                      descending: bool) -> tuple[TM, TM]:
    """One step of the bitonic network: in every block of 2j elements, element i of the first
    half is compared with element i of the second half (with element j-1-i of it, when
    `mirror`), and the two swap when they are out of order."""
    lead, size = values.shape[:-1], values.shape[-1]
    pairs = (*lead, size // (2 * j), 2, j)
    first = [None] * len(lead) + [None, (0, 1), None]
    second = [None] * len(lead) + [None, (1, 2), None]
    halves = []
    for tensor in (values.reshape(pairs), index.reshape(pairs)):
        low, high = tensor.shrink(first), tensor.shrink(second)
        halves.append((low, high.flip(-1) if mirror else high))
    (v0, v1), (i0, i1) = halves
    swap = _comes_after((*_sort_key(v0, i0, n, descending), i0),
                        (*_sort_key(v1, i1, n, descending), i1))
    in_second = type(values).arange(2, device=values.device).reshape(1, 2, 1) == 1
    results = []
    for low, high in halves:
        new_high = swap.where(low, high)
        if mirror:
            new_high = new_high.flip(-1)
        joined = in_second.where(new_high, swap.where(high, low))
        results.append(joined.reshape(values.shape).contiguous())
    return results[0], results[1]


# the signed integer of each float size: a float's sign is its bits' sign
_SIGNED = {2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}


def _integer_tensor_power(base: TM, power: TM) -> TM:
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



# ---- bfloat16: a composed function rounds once ----
# A function built from several primitives (exp is EXP2 of a product, sigmoid four ops) would
# round to bfloat16 after each of them. PyTorch computes the whole function in float32 and
# rounds its result once; so do these: on a bfloat16 tensor they run on its float32 values
# (exact) and cast the result back. (The primitives themselves already compute in float32.)
BFLOAT16_COMPOSED = ("exp", "log", "rsqrt", "cos", "tan", "sigmoid", "tanh", "gelu", "silu",
                     "swish", "elu", "softplus", "pow", "log10", "asin", "acos", "atan", "sinh",
                     "cosh", "atanh", "asinh", "acosh", "erf", "celu", "selu", "hardsigmoid",
                     "hardswish", "quick_gelu", "mish", "softsign", "logsigmoid", "lerp",
                     "logaddexp", "div")


def in_float32_for_bfloat16(method: Callable[..., Any]) -> Callable[..., Any]:
    """`method`, computed in float32 when called on a bfloat16 tensor (bfloat16 tensor
    arguments too) and rounded back to bfloat16 once."""
    @functools.wraps(method)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.dtype != dtypes.bfloat16:
            return method(self, *args, **kwargs)
        wide = [a.float() if isinstance(a, TensorMovement) and a.dtype == dtypes.bfloat16
                else a for a in args]
        return method(self.float(), *wide, **kwargs).cast(dtypes.bfloat16)
    return wrapped


for _name in BFLOAT16_COMPOSED:
    setattr(TensorMath, _name, in_float32_for_bfloat16(getattr(TensorMath, _name)))
