"""Chapter 1 (part 7): neural-network ops — matmul, conv2d, pooling, softmax, norms, losses.

What this teaches:
- matmul is broadcasting plus one reduction: (n, 1, k) * (1, m, k), summed over k. The
  scheduler fuses the multiply into the sum, so it is one kernel, not an n*m*k temporary;
- a convolution is the same idea over sliding windows: `pool` (tensor_math.py) makes the windows
  with movement ops only, one multiply and one sum over (channels, kh, kw) do the rest;
  average and max pooling reduce the same windows with mean and max;
- softmax, log_softmax and logsumexp subtract the max first, so that exp cannot overflow; the
  max is detached, because the result does not depend on it;
- layernorm, batchnorm, dropout and the losses (cross-entropy with label smoothing, binary
  cross-entropy, also from logits) are a few lines each of what is above.

Builds on: tensor_math.py (part 6). Used by: tensor.py's Tensor, nn/ and every training loop.

>>> from tinyteach import Tensor
>>> Tensor([[1.0, 2.0]]).matmul(Tensor([[3.0], [4.0]])).tolist()
[[11.0]]
>>> [round(p, 4) for p in Tensor([0.0, 0.0]).softmax().tolist()]
[0.5, 0.5]
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tinyteach.dtype import dtypes, least_upper_dtype
from tinyteach.helpers import TRAINING
from tinyteach.tensor_create import as_tensor
from tinyteach.tensor_math import TensorMath, pool

if TYPE_CHECKING:
    from tinyteach.tensor import Tensor


class TensorNN(TensorMath):
    """matmul, convolution, pooling, softmax, normalization, dropout and losses (part 7)."""

    # ---- matmul: multiply, then sum over the shared axis ----

    def dot(self, other: Tensor) -> Tensor:
        return self.matmul(other)

    def matmul(self, other: Tensor) -> Tensor:
        """Multiply then sum over the shared axis: (n, 1, k) * (1, m, k) -> sum -> (n, m)."""
        if not isinstance(other, type(self)):  # type(self) is Tensor
            raise TypeError(f"matmul needs a Tensor, got {type(other).__name__}")
        if self.ndim == 0 or other.ndim == 0:
            raise ValueError(f"matmul needs at least 1-d tensors, got shapes {self.shape} and "
                             f"{other.shape}")
        x = self.unsqueeze(0) if self.ndim == 1 else self
        w = other.unsqueeze(-1) if other.ndim == 1 else other
        if x.shape[-1] != w.shape[-2]:
            raise ValueError(f"matmul shape mismatch: {self.shape} @ {other.shape} "
                             f"(inner dimensions {x.shape[-1]} != {w.shape[-2]})")
        product = x.unsqueeze(-2) * w.transpose(-1, -2).unsqueeze(-3)
        result = product.sum(-1, dtype=least_upper_dtype(x.dtype, w.dtype))
        if self.ndim == 1:
            result = result.squeeze(-2)
        if other.ndim == 1:
            result = result.squeeze(-1)
        return result

    def linear(self, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        out = self * weight if weight.ndim == 1 else self.dot(weight)
        return out if bias is None else out + bias

    # ---- convolution and pooling: sliding windows (tensor_math.pool), then one reduce ----

    def conv2d(self, weight: Tensor, bias: Tensor | None = None, groups: int = 1,
               stride: int | Sequence[int] = 1, dilation: int | Sequence[int] = 1,
               padding: int | Sequence[int] = 0) -> Tensor:
        """2-d convolution (cross-correlation, as PyTorch): windows from `pool`, one reduce."""
        if self.ndim != 4 or weight.ndim != 4:
            raise ValueError(f"conv2d needs (N, C, H, W) input and (O, C/groups, kH, kW) weight, "
                             f"got {self.shape} and {weight.shape}")
        batch, channels = self.shape[:2]
        out_channels, group_channels, kh, kw = weight.shape
        if channels != group_channels * groups or out_channels % groups:
            raise ValueError(f"conv2d: input has {channels} channels, weight {weight.shape} with "
                             f"groups={groups} expects {group_channels * groups}")
        pad_pairs = _conv_padding(padding, 2)
        x = self.pad([(0, 0), (0, 0), *pad_pairs])
        windows = pool(x, (kh, kw), _pair(stride), _pair(dilation))  # (N, C, oh, ow, kh, kw)
        oh, ow = windows.shape[2:4]
        per_group = out_channels // groups
        x = windows.reshape(batch, groups, 1, group_channels, oh, ow, kh, kw)
        w = weight.reshape(1, groups, per_group, group_channels, 1, 1, kh, kw)
        out = (x * w).sum((3, 6, 7)).reshape(batch, out_channels, oh, ow)
        return out if bias is None else out + bias.reshape(1, -1, 1, 1)

    def avg_pool2d(self, kernel_size: int | Sequence[int] = 2,
                   stride: int | Sequence[int] | None = None, padding: int | Sequence[int] = 0,
                   count_include_pad: bool = True) -> Tensor:
        kernel = _pair(kernel_size)
        pad_pairs = _conv_padding(padding, 2)
        x = self.pad([(0, 0)] * (self.ndim - 2) + list(pad_pairs))
        windows = pool(x, kernel, _pair(stride or kernel))
        if count_include_pad or not any(p != (0, 0) for p in pad_pairs):
            return windows.mean((-2, -1))
        ones = type(self).ones(*self.shape[-2:], device=self.device).pad(pad_pairs)
        counts = pool(ones, kernel, _pair(stride or kernel)).sum((-2, -1))
        return windows.sum((-2, -1)) / counts

    def max_pool2d(self, kernel_size: int | Sequence[int] = 2,
                   stride: int | Sequence[int] | None = None, padding: int | Sequence[int] = 0,
                   dilation: int | Sequence[int] = 1) -> Tensor:
        kernel = _pair(kernel_size)
        pad_pairs = _conv_padding(padding, 2)
        x = self.pad([(0, 0)] * (self.ndim - 2) + list(pad_pairs), value=-math.inf)
        return pool(x, kernel, _pair(stride or kernel), _pair(dilation)).max((-2, -1))

    # ---- softmax and its relatives: subtract the max first, so exp cannot overflow ----

    def softmax(self, axis: int = -1) -> Tensor:
        shifted = self._to_float() - self._shift(axis)
        e = shifted.exp()
        return e / e.sum(axis, keepdim=True)

    def log_softmax(self, axis: int = -1) -> Tensor:
        shifted = self._to_float() - self._shift(axis)
        return shifted - shifted.exp().sum(axis, keepdim=True).log()

    def _shift(self, axis: Any) -> Tensor:
        """The max along `axis`, subtracted before exp() so it cannot overflow. Detached: the
        result does not depend on the shift (its gradient is exactly zero), and backward would
        otherwise spend two reductions (and two kernels) computing that zero. (tinygrad
        detaches it too.)"""
        return self._to_float().max(axis, keepdim=True).detach()

    def logsumexp(self, axis: Any = None, keepdim: bool = False) -> Tensor:
        peak = self._shift(axis)
        peak = (peak.abs() == math.inf).where(0.0, peak)  # all -inf: the answer is -inf, not nan
        total = (self - peak).exp().sum(axis, keepdim=True).log() + peak
        return total if keepdim else total.reshape(
            tuple(s for i, s in enumerate(self.shape) if i not in self._axes(axis)))

    # ---- normalization and dropout ----

    def layernorm(self, axis: int | Sequence[int] = -1, eps: float = 1e-5) -> Tensor:
        centered = self - self.mean(axis, keepdim=True)
        return centered * ((centered * centered).mean(axis, keepdim=True) + eps).rsqrt()

    def batchnorm(self, weight: Tensor | None, bias: Tensor | None, mean: Tensor,
                  invstd: Tensor, axis: int | Sequence[int] = 1) -> Tensor:
        axes = self._axes(axis)
        shape = tuple(s if i in axes else 1 for i, s in enumerate(self.shape))
        x = self - mean.reshape(shape)
        if weight is not None:
            x = x * weight.reshape(shape)
        x = x * (invstd.reshape(shape) if invstd.ndim == len(axes) else invstd)
        return x if bias is None else x + bias.reshape(shape)

    def dropout(self, p: float = 0.5) -> Tensor:
        if not 0 <= p <= 1:
            raise ValueError(f"dropout probability must be in [0, 1], got {p}")
        if not (type(self).training or TRAINING) or p == 0:
            return as_tensor(self)
        if p == 1:
            return self.zeros_like()
        keep = type(self).rand(*self.shape, device=self.device) >= p
        return keep.where(self, 0) * (1 / (1 - p))

    # ---- losses ----

    def one_hot(self, num_classes: int = -1) -> Tensor:
        if dtypes.is_float(self.dtype):
            raise TypeError(f"one_hot needs integer class indices, not {self.dtype}")
        if num_classes == -1:
            num_classes = int(self.max().item()) + 1
        classes = type(self).arange(num_classes, device=self.device)
        return (self.unsqueeze(-1) == classes).where(1, 0)

    def sparse_categorical_crossentropy(self, Y: Tensor, ignore_index: int = -1,
                                        label_smoothing: float = 0.0,
                                        reduction: str = "mean") -> Tensor:
        """Cross-entropy of logits `self` (N, C) against integer labels Y (N,)."""
        if Y.shape != self.shape[:-1]:
            raise ValueError(f"labels of shape {Y.shape} do not match logits {self.shape}")
        log_probs = self.log_softmax(-1)
        counted = Y != ignore_index
        picked = (Y.unsqueeze(-1) == type(self).arange(self.shape[-1], device=self.device))
        # each log-probability's weight: 1 on the target class, 0 elsewhere and on ignored items;
        # label smoothing moves `label_smoothing` of it evenly over all the classes
        kept = counted.unsqueeze(-1)
        weights = (picked & kept).cast(log_probs.dtype)
        if label_smoothing:
            spread = kept.cast(log_probs.dtype) * (label_smoothing / self.shape[-1])
            weights = weights * (1 - label_smoothing) + spread
        per_class = -(log_probs * weights)
        if reduction == "none":
            return per_class.sum(-1)
        # one sum over items and classes at once: a sum of per-item sums would be two kernels
        # (a reduction that feeds another reduction is stored)
        return _reduce_loss(per_class, reduction, counted)

    def cross_entropy(self, Y: Tensor, reduction: str = "mean") -> Tensor:
        return self.sparse_categorical_crossentropy(Y, reduction=reduction)

    def binary_crossentropy(self, Y: Tensor, reduction: str = "mean") -> Tensor:
        """For probabilities `self` in (0, 1); logs are clipped at -100 as PyTorch does."""
        log_p = self.log().maximum(-100)
        log_not_p = (1 - self).log().maximum(-100)
        return _reduce_loss(-(Y * log_p + (1 - Y) * log_not_p), reduction)

    def binary_crossentropy_logits(self, Y: Tensor, reduction: str = "mean") -> Tensor:
        # log(sigmoid(x)) = -softplus(-x), written stably: max(x, 0) - x*y + log(1 + e^-|x|).
        # At x = 0 the kinks must add up to the true gradient sigmoid(0) - y = 0.5 - y:
        # abs contributes 0 there, and maximum splits a tie, contributing 0.5.
        loss = self.maximum(0) - self * Y + (1 + (-self.abs()).exp()).log()
        return _reduce_loss(loss, reduction)

def _reduce_loss(loss: Tensor, reduction: str, counted: Tensor | None = None) -> Tensor:
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    if reduction == "mean":
        return loss.sum() / counted.sum() if counted is not None else loss.mean()
    raise ValueError(f"reduction must be 'mean', 'sum' or 'none', not {reduction!r}")


def _pair(value: int | Sequence[int] | None) -> tuple[int, int]:
    if value is None:
        raise ValueError("expected an int or a pair of ints")
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))


def _conv_padding(padding: int | Sequence[int], dims: int) -> list[tuple[int, int]]:
    """PyTorch's conv padding: an int, one per spatial axis, or (left, right, top, bottom)."""
    if isinstance(padding, int):
        return [(padding, padding)] * dims
    values = list(padding)
    if len(values) == dims:
        return [(int(p), int(p)) for p in values]
    if len(values) == 2 * dims:
        from tinyteach.tensor import _padding_pairs  # (tensor.py imports this module)
        return _padding_pairs(values, dims)
    raise ValueError(f"padding {padding} does not fit {dims} spatial axes")


