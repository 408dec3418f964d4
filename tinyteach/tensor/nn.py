"""Chapter 1 (part 7): neural-network ops — matmul, conv2d, pooling, softmax, norms, losses.

What this teaches:
- matmul is broadcasting plus one reduction: (n, 1, k) * (1, m, k), summed over k. The
  scheduler fuses the multiply into the sum, so it is one kernel, not an n*m*k temporary;
- a convolution is the same idea over sliding windows: `pool` (tensor/math.py) makes the windows
  with movement ops only, one multiply and one sum over (channels, kh, kw) do the rest, for
  any number of spatial axes; average and max pooling reduce the same windows with mean and
  max (ceil_mode is a little more padding; return_indices compares each window with its max);
- a transposed convolution is a convolution too: spread the input with zeros, pad it, and
  convolve with the kernel flipped and its channel axes swapped;
- softmax, log_softmax and logsumexp subtract the max first, so that exp cannot overflow; the
  max is detached, because the result does not depend on it;
- layernorm, batchnorm, dropout and the losses (cross-entropy with label smoothing, binary
  cross-entropy, also from logits, nll_loss) are a few lines each of what is above, and so
  are attention (softmax(q k^T / sqrt(d)) v), einsum (permute, broadcast, multiply, sum) and
  interpolate (a mask of the source positions, built from aranges, then a sum).

Builds on: tensor/math.py (part 6). Used by: tensor/__init__.py's Tensor, nn/ and every training
loop.

>>> from tinyteach import Tensor
>>> Tensor([[1.0, 2.0]]).matmul(Tensor([[3.0], [4.0]])).tolist()
[[11.0]]
>>> [round(p, 4) for p in Tensor([0.0, 0.0]).softmax().tolist()]
[0.5, 0.5]
"""
from __future__ import annotations

import math
import string
from collections.abc import Callable, Sequence
from typing import Any, Self, TypeVar

import numpy as np

from tinyteach.dtype import DType, dtypes, least_upper_dtype
from tinyteach.settings import TRAINING
from tinyteach.tensor.core import ArgumentError, ShapeError, padding_pairs, pool
from tinyteach.tensor.gradient import register_gradient
from tinyteach.tensor.math import TensorMath, in_float32_for_bfloat16

N = TypeVar("N", bound="TensorNN")  # the helper functions return what they were given


class TensorNN(TensorMath):
    """matmul, convolution, pooling, softmax, normalization, dropout and losses (part 7)."""

    # ---- matmul: multiply, then sum over the shared axis ----

    def __matmul__(self, other: Self) -> Self:
        return self.matmul(other)

    def __rmatmul__(self, other: Self) -> Self:
        return other.matmul(self)

    def dot(self, other: Self, dtype: DType | str | type | None = None) -> Self:
        return self.matmul(other, dtype=dtype)

    def matmul(self, other: Self, dtype: DType | str | type | None = None) -> Self:
        """Multiply then sum over the shared axis: (n, 1, k) * (1, m, k) -> sum -> (n, m).
        `dtype` (tinygrad's) is the dtype the products are summed in, and the result's."""
        if not isinstance(other, type(self)):  # type(self) is Tensor
            raise TypeError(f"matmul needs a Tensor, got {type(other).__name__}")
        if self.ndim == 0 or other.ndim == 0:
            raise ShapeError(f"matmul needs at least 1-d tensors, got shapes {self.shape} and "
                             f"{other.shape}")
        x = self.unsqueeze(0) if self.ndim == 1 else self
        w = other.unsqueeze(-1) if other.ndim == 1 else other
        if x.shape[-1] != w.shape[-2]:
            raise ShapeError(f"matmul shape mismatch: {self.shape} @ {other.shape} "
                             f"(inner dimensions {x.shape[-1]} != {w.shape[-2]})")
        product = x.unsqueeze(-2) * w.transpose(-1, -2).unsqueeze(-3)
        result = product.sum(-1, dtype=dtype or least_upper_dtype(x.dtype, w.dtype))
        if self.ndim == 1:
            result = result.squeeze(-2)
        if other.ndim == 1:
            result = result.squeeze(-1)
        return result

    def linear(self, weight: Self, bias: Self | None = None,
               dtype: DType | str | type | None = None) -> Self:
        """x @ weight + bias (weight is (in, out), as tinygrad; 1-d weight: x * weight)."""
        if weight.ndim == 1:
            out = self * weight if dtype is None else (self * weight).cast(dtype)
        else:
            out = self.dot(weight, dtype=dtype)
        return out if bias is None else out + bias

    def newton_schulz(self, steps: int, params: Sequence[float], eps: float = 1.0e-7) -> Self:
        """Push every singular value of this matrix towards 1, keeping its singular vectors
        (tinygrad's; Muon's orthogonalization). Divide by the Frobenius norm, then `steps`
        times apply the odd polynomial with coefficients `params` = (a, b, c, ...):
        A = G @ G.T; G <- a*G + b*A@G + c*A@A@G + ... A tall matrix is transposed first, so
        A is the smaller Gram matrix; leading axes are a batch."""
        if self.ndim < 2:
            raise ValueError(f"newton_schulz needs a matrix (2 or more axes), got shape "
                             f"{self.shape}")
        if not params:
            raise ValueError("newton_schulz needs at least one coefficient in params")
        if self.shape[-2] > self.shape[-1]:
            return self.transpose(-2, -1).newton_schulz(steps, params, eps).transpose(-2, -1)
        x = self / (self.square().sum(axis=(-2, -1), keepdim=True).sqrt() + eps)
        for _ in range(steps):
            gram = x @ x.transpose(-2, -1)
            term, total = x, x * params[0]
            for coefficient in params[1:]:
                term = gram @ term
                total = total + term * coefficient
            x = total
        return x

    def qr(self) -> tuple[Self, Self]:
        """The QR decomposition of the last two axes: self = Q @ R, Q with orthonormal columns,
        R upper triangular, reduced as PyTorch's default (Q m x k, R k x n, k = min(m, n));
        leading axes are a batch. Householder reflections, as LAPACK (so the signs agree with
        PyTorch's): step j reflects column j's part below the diagonal onto the axis,
        H = I - 2 v v^T / (v^T v) with v = x + sign(x_0) |x| e_0, applied as a matmul
        (R <- H R, Q <- Q H); a column already zero below the diagonal is left alone."""
        if self.ndim < 2:
            raise ValueError(f"qr needs a matrix (2 or more axes), got shape {self.shape}")
        m, n = self.shape[-2:]
        x = self if dtypes.is_float(self.dtype) else self.float()
        batch = x.shape[:-2]
        q = type(self).eye(m, dtype=x.dtype, device=self.device).expand(*batch, m, m)
        r = x
        rows = type(self).arange(m, device=self.device)
        for j in range(min(m - 1, n)):
            below = (rows >= j).cast(x.dtype)                       # (m,): rows j..m-1
            column = _part(r, -1, j, j + 1).squeeze(-1) * below      # (..., m)
            head = _part(column, -1, j, j + 1).squeeze(-1)
            norm = column.square().sum(-1).sqrt()
            sign = (head >= 0).where(1.0, -1.0)
            v = column + (rows == j).cast(x.dtype) * (sign * norm).unsqueeze(-1)
            vv = v.square().sum(-1)
            tail = (column.square().sum(-1) - head.square()) > 0
            scale = tail.where(2 / vv.maximum(1e-30), 0.0)          # 0: nothing to reflect
            reflector = v.unsqueeze(-1) * v.unsqueeze(-2) * scale.unsqueeze(-1).unsqueeze(-1)
            h = type(self).eye(m, dtype=x.dtype, device=self.device) - reflector
            r, q = (h @ r).realize(), (q @ h).realize()  # (realized: each step reads the last)
        k = min(m, n)
        return _part(q, -1, 0, k), _part(r, -2, 0, k).triu()

    def svd(self, full_matrices: bool = True) -> tuple[Self, Self, Self]:
        """The singular value decomposition of the last two axes, self = U @ diag(S) @ Vh, as
        PyTorch's torch.linalg.svd: S descending; U m x m and Vh n x n (full_matrices) or
        m x k and k x n (k = min(m, n)). One-sided Jacobi (Hestenes): plane rotations of
        pairs of columns, each chosen to make the two orthogonal, sweep after sweep
        (`SVD_SWEEPS`), applied to U (starting as the matrix) and V (starting as I) as a
        matmul by a rotation matrix; then S is the columns' lengths, U the columns over
        them. The singular vectors are unique only up to sign (and within equal values):
        check U @ diag(S) @ Vh, not U itself, against another library."""
        if self.ndim < 2:
            raise ValueError(f"svd needs a matrix (2 or more axes), got shape {self.shape}")
        m, n = self.shape[-2:]
        if m < n:  # the columns of the transpose: A^T = V S U^T
            u, singular, vh = self.transpose(-2, -1).svd(full_matrices)
            return vh.transpose(-2, -1), singular, u.transpose(-2, -1)
        x = self if dtypes.is_float(self.dtype) else self.float()
        batch = x.shape[:-2]
        # U on top of V, rotated together: one matmul per rotation. The pair (p, q) enters as
        # two one-hot vectors, data rather than constants, so every rotation is the same
        # graph and its kernels are compiled once (the plan cache, chapter 9)
        eye = type(self).eye(n, dtype=x.dtype, device=self.device)
        both = x.cat(eye.expand(*batch, n, n), dim=-2).contiguous().realize()
        units = [_part(eye, 0, k, k + 1).reshape(n).contiguous().realize() for k in range(n)]
        for _ in range(SVD_SWEEPS):
            if _off_diagonal(_part(both, -2, 0, m)) < SVD_TOLERANCE:
                break
            for p in range(n):
                for q in range(p + 1, n):
                    rotation = _jacobi_rotation(_part(both, -2, 0, m), units[p], units[q])
                    both = both @ rotation
                    both = both.realize()
        u, v = _part(both, -2, 0, m), _part(both, -2, m, m + n)
        lengths = u.square().sum(-2).sqrt()                            # (..., n)
        order = lengths.argsort(-1, descending=True)
        singular = lengths.gather(-1, order)
        columns = order.unsqueeze(-2).expand(*batch, m, n)
        u = u.gather(-1, columns) / singular.maximum(1e-30).unsqueeze(-2)
        v = v.gather(-1, order.unsqueeze(-2).expand(*batch, n, n))
        if full_matrices and m > n:  # complete U: the reflections of QR([U | I]) after U's
            basis = u.cat(type(self).eye(m, dtype=x.dtype, device=self.device)
                          .expand(*batch, m, m), dim=-1)
            u = u.cat(_part(basis.qr()[0], -1, n, m), dim=-1)
        return u, singular, v.transpose(-2, -1)

    # ---- convolution and pooling: sliding windows (tensor_math.pool), then one reduce ----

    def conv2d(self, weight: Self, bias: Self | None = None, groups: int = 1,
               stride: int | Sequence[int] = 1, dilation: int | Sequence[int] = 1,
               padding: int | str | Sequence[int] = 0,
               dtype: DType | str | type | None = None) -> Self:
        """Convolution (cross-correlation, as PyTorch) over any number of spatial axes, as in
        tinygrad: input (N, C, *spatial), weight (O, C/groups, *kernel). Windows from `pool`,
        then one multiply and one sum over (C/groups, *kernel), in `dtype` if given.
        `padding` is as in PyTorch: an int, one per axis, (left, right, top, bottom, ...),
        "valid" (none) or "same" (the output keeps the input's size; stride 1 only).
        Its gradient is stated as a whole (`_conv_gradient_rule`): the input's is a
        transposed convolution."""
        dims = _check_conv(self, weight, bias, groups)
        batch = self.shape[0]
        out_channels, group_channels, *kernel = weight.shape
        dilations = _ints(dilation, dims, "dilation")
        strides = _ints(stride, dims, "stride")
        pad_pairs = _named_padding(padding, kernel, dilations, strides)
        padded = x = self.pad([(0, 0), (0, 0), *pad_pairs])
        _check_window_fits("conv2d", x.shape[2:], kernel, dilations)
        windows = pool(x, kernel, strides, dilations)  # (N, C, *out, *k)
        out = windows.shape[2:2 + dims]
        per_group = out_channels // groups
        x = windows.reshape(batch, groups, 1, group_channels, *out, *kernel)
        w = weight.reshape(1, groups, per_group, group_channels, *[1] * dims, *kernel)
        summed = (3, *range(4 + dims, 4 + 2 * dims))
        result = (x * w).sum(summed, dtype=dtype).reshape(batch, out_channels, *out)
        if dtype is None and all(isinstance(n, int) for n in (*padded.shape, *weight.shape)):
            register_gradient(result.uop, (padded.uop, weight.uop),
                              _conv_gradient_rule(type(self), padded.device, groups, strides,
                                                  dilations))
        return result if bias is None else result + bias.reshape(1, -1, *[1] * dims)

    def _conv_weight_gradient(self, grad: Self, kernel: Sequence[int], groups: int,
                              strides: Sequence[int], dilations: Sequence[int]) -> Self:
        """d conv2d / d weight, for this padded input and the output's gradient `grad`
        (N, O, *out): each weight tap sums, over the batch and the output pixels, the
        gradient times the input pixel it saw — the same product as the forward, summed over
        other axes."""
        dims = len(kernel)
        batch, out_channels, *out = grad.shape
        windows = pool(self, kernel, strides, dilations)
        group_channels = self.shape[1] // groups
        x = windows.reshape(batch, groups, 1, group_channels, *out, *kernel)
        g = grad.reshape(batch, groups, out_channels // groups, 1, *out, *[1] * dims)
        summed = (0, *range(4, 4 + dims))
        return (x * g).sum(summed).reshape(out_channels, group_channels, *kernel)

    def conv_transpose2d(self, weight: Self, bias: Self | None = None, groups: int = 1,
                         stride: int | Sequence[int] = 1, dilation: int | Sequence[int] = 1,
                         padding: int | Sequence[int] = 0,
                         output_padding: int | Sequence[int] = 0) -> Self:
        """The transposed convolution (PyTorch's conv_transpose2d), built from conv2d.

        x is (N, C_in, H, W) and weight (C_in, C_out/groups, kH, kW), as in PyTorch. Where
        conv2d gathers a window of input pixels into one output pixel, its transpose
        scatters each input pixel, times the kernel, onto a window of the output (it is the
        gradient of conv2d with respect to its input). A scatter is turned into a gather:

        1. spread the input: put stride-1 zeros between neighbouring pixels, so that one step
           in the input is `stride` steps in the output (`_spread`: reshape, pad, shrink);
        2. pad each side with d*(k-1) - padding zeros, and output_padding more at the end, so
           a window that only just touches the input still produces an output pixel; when
           padding is larger than d*(k-1) the amount is negative and the edge is cropped;
        3. flip the kernel in space (scattering with tap i is gathering with tap k-1-i) and,
           within each group, swap its two channel axes: (C_in, C_out/groups) becomes the
           (C_out, C_in/groups) that conv2d expects;
        4. run conv2d with stride 1 and the same dilation, on the spread and padded input
           stored as a buffer of its own.

        Each output axis has (H-1)*stride - 2*padding + dilation*(k-1) + output_padding + 1
        pixels. Every step is a movement op or conv2d, so autograd needs nothing new.
        (tinygrad builds it the same way.)"""
        x = self
        _check_conv_transpose(x, weight, bias, groups)
        dims = x.ndim - 2  # any number of spatial axes, as conv2d
        strides, dilations = _ints(stride, dims, "stride", False), _ints(dilation, dims,
                                                                         "dilation", False)
        paddings = _ints(padding, dims, "padding", False)
        extras = _ints(output_padding, dims, "output_padding", False)
        _check_conv_transpose_sizes(x.shape[2:], weight.shape[2:], strides, dilations,
                                    paddings, extras)
        in_channels, per_group, *kernel = weight.shape
        pairs = [(d * (k - 1) - p, d * (k - 1) - p + extra)
                 for k, d, p, extra in zip(kernel, dilations, paddings, extras)]
        # (stored once: a convolution reading through the zeros would test every load, and
        # a load that is tested does not vectorize)
        x = _spread(x, strides).pad([(0, 0), (0, 0), *pairs]).contiguous()  # (negative: crop)
        w = weight.reshape(groups, in_channels // groups, per_group, *kernel).transpose(1, 2)
        w = w.flip(tuple(range(3, 3 + dims)))
        w = w.reshape(groups * per_group, in_channels // groups, *kernel)
        return x.conv2d(w, bias, groups, stride=1, dilation=dilations)

    def avg_pool2d(self, kernel_size: int | Sequence[int] = 2,
                   stride: int | Sequence[int] | None = None, padding: int | Sequence[int] = 0,
                   ceil_mode: bool = False, count_include_pad: bool = True,
                   divisor_override: int | None = None,
                   dilation: int | Sequence[int] = 1) -> Self:
        """Average over windows of the last len(kernel_size) axes (2 for an int), PyTorch's
        arguments: `ceil_mode` adds a last, partial window where floor would drop it (its
        divisor counts only what it covers); `count_include_pad=False` divides by the number
        of input elements, not zeros of the padding, in each window. `dilation` (tinygrad's)
        spaces the window's taps."""
        kernel = _pool_kernel(kernel_size)
        strides = _ints(stride or kernel, len(kernel), "stride")
        dilations = _ints(dilation, len(kernel), "dilation")
        pads, extra = _pool_padding(self, kernel, strides, dilations, padding,
                                    ceil_mode)
        lead = [(0, 0)] * (self.ndim - len(kernel))
        x = self.pad(lead + [(b, a + e) for (b, a), e in zip(pads, extra)])
        windows = pool(x, kernel, strides, dilations)
        axes = tuple(range(-len(kernel), 0))
        if divisor_override is not None:
            if divisor_override == 0:
                raise ValueError("avg_pool2d: divisor_override must not be 0")
            return windows.sum(axes) / divisor_override
        if not any(extra) and (count_include_pad or not any(p != (0, 0) for p in pads)):
            return windows.mean(axes)
        counted = type(self).ones(*self.shape[-len(kernel):], device=self.device)
        if count_include_pad:
            counted = counted.pad(pads, value=1)
            pads = [(0, 0)] * len(kernel)
        counted = counted.pad([(b, a + e) for (b, a), e in zip(pads, extra)])
        return windows.sum(axes) / pool(counted, kernel, strides, dilations).sum(axes)

    def max_pool2d(self, kernel_size: int | Sequence[int] = 2,
                   stride: int | Sequence[int] | None = None, padding: int | Sequence[int] = 0,
                   dilation: int | Sequence[int] = 1, ceil_mode: bool = False,
                   return_indices: bool = False) -> Self | tuple[Self, Self]:
        """Max over windows of the last len(kernel_size) axes (2 for an int). `ceil_mode` as
        in avg_pool2d; `return_indices` also returns where each max came from, as PyTorch: an
        index into the flattened spatial axes of the input, the first one on a tie."""
        kernel = _pool_kernel(kernel_size)
        strides = _ints(stride or kernel, len(kernel), "stride")
        dilations = _ints(dilation, len(kernel), "dilation")
        pads, extra = _pool_padding(self, kernel, strides, dilations, padding, ceil_mode)
        full = [(0, 0)] * (self.ndim - len(kernel)) + [(b, a + e)
                                                       for (b, a), e in zip(pads, extra)]
        # padding never wins a max: -inf, or the smallest value of an integer dtype (which
        # then stays integer, as in PyTorch)
        lowest = -math.inf if dtypes.is_float(self.dtype) else self.dtype.min
        x = self.pad(full, value=lowest)
        axes = tuple(range(-len(kernel), 0))
        windows = pool(x, kernel, strides, dilations)
        values = windows.max(axes)
        if not return_indices:
            return values
        spatial = self.shape[-len(kernel):]
        positions = type(self).arange(math.prod(spatial), device=self.device).reshape(spatial)
        position_windows = pool(positions.pad(full[-len(kernel):], value=-1), kernel,
                                strides, dilations)
        hit = windows == values.reshape(*values.shape, *[1] * len(kernel))
        first = hit.where(position_windows, math.prod(spatial)).min(axes)
        return values, first.detach()

    def max_unpool2d(self, indices: Self, kernel_size: int | Sequence[int] = 2,
                     stride: int | Sequence[int] | None = None,
                     dilation: int | Sequence[int] = 1, padding: int | Sequence[int] = 0,
                     output_size: Sequence[int] | None = None) -> Self:
        """The inverse of max_pool2d(return_indices=True) (PyTorch's and tinygrad's): each
        value goes back to the place `indices` says it came from (an index into the output's
        flattened spatial axes), zeros elsewhere. A scatter as a masked sum: one-hot places
        (index == arange(output size)) select the values, summed over the inputs. The output
        size is (in - 1) * stride - 2 * padding + dilation * (kernel - 1) + 1 per axis, or
        `output_size` (its last axes)."""
        kernel = _pool_kernel(kernel_size)
        dims = len(kernel)
        strides = _ints(stride or kernel, dims, "stride")
        dilations, pads = _ints(dilation, dims, "dilation"), _ints(padding, dims, "padding", False)
        if indices.shape != self.shape:
            raise ValueError(f"max_unpool2d: indices {indices.shape} must have the shape of the "
                             f"input {self.shape}")
        spatial_in = self.shape[-dims:]
        spatial = tuple(output_size[-dims:]) if output_size is not None else tuple(
            (n - 1) * s - 2 * p + d * (k - 1) + 1
            for n, s, p, d, k in zip(spatial_in, strides, pads, dilations, kernel))
        batch = self.shape[:-dims]
        count = math.prod(spatial)
        found = indices.numpy()  # an index past the output would select nothing: a silent 0
        if found.size and (found.min() < 0 or found.max() >= count):
            raise RuntimeError(f"max_unpool2d: index {int(found.max())} does not fit an output of "
                               f"size {'x'.join(map(str, spatial))} (give output_size)")
        values = self.reshape(*batch, math.prod(spatial_in), 1)
        places = indices.reshape(*batch, math.prod(spatial_in), 1)
        one_hot = places == type(self).arange(count, device=self.device)
        # overlapping windows send one input twice: the last one that lands counts (PyTorch)
        hits = one_hot.cast(dtypes.int32)
        last = one_hot & (hits.flip(-2).cumsum(-2).flip(-2) - hits == 0)
        return last.where(values, 0).sum(-2, dtype=self.dtype).reshape(*batch, *spatial)

    def interpolate(self, size: Sequence[int], mode: str = "linear",
                    align_corners: bool = False) -> Self:
        """Resample the last len(size) axes to `size` (PyTorch's F.interpolate with its linear,
        bilinear and trilinear modes all called "linear", and "nearest", "nearest-exact").

        One axis at a time: output o reads the input at a source coordinate, src(o) =
        (o + 1/2) * n/out - 1/2 (clamped at 0), or o * (n-1)/(out-1) with align_corners;
        "linear" mixes the two neighbours floor(src) and the next one, "nearest" takes
        floor(o * n/out), "nearest-exact" floor((o + 1/2) * n/out). The choice is a mask of
        shape (out, n) built from aranges, so a resample is a `where` and a sum over n."""
        if mode not in ("linear", "nearest", "nearest-exact"):
            raise ValueError(f"interpolate mode must be 'linear', 'nearest' or "
                             f"'nearest-exact', not {mode!r}")
        sizes = list(size)
        if not 0 < len(sizes) <= self.ndim or not all(isinstance(s, int) and s > 0
                                                        for s in sizes):
            raise ValueError(f"interpolate needs 1 to {self.ndim} positive int sizes for shape "
                             f"{self.shape}, got {size}")
        if align_corners and mode != "linear":
            raise ValueError("interpolate: align_corners only applies to mode 'linear'")
        axes = list(zip(range(self.ndim - len(sizes), self.ndim), sizes))
        if self.dtype == dtypes.uint8 and mode == "linear":
            x = self
            for axis, out in reversed(axes):  # the last axis first, as PyTorch's uint8 kernel
                x = _resample_uint8_axis(x.transpose(axis, -1), out, align_corners)
                x = x.transpose(axis, -1)
            return x
        x = self._to_float()
        for axis, out in axes:
            x = _resample_axis(x.transpose(axis, -1), out, mode, align_corners).transpose(axis, -1)
        if dtypes.is_float(self.dtype):
            return x
        # integers stay integers, as in PyTorch: nearest picks values exactly, linear rounds
        return (x if mode != "linear" else x.round()).cast(self.dtype)

    # ---- softmax and its relatives: subtract the max first, so exp cannot overflow ----

    def softmax(self, axis: int = -1, dtype: DType | str | type | None = None) -> Self:
        """exp(x - max) / sum(exp(x - max)); `dtype` casts the input first (PyTorch's)."""
        if dtype is not None:
            return self.cast(dtypes.as_dtype(dtype)).softmax(axis)
        shifted = self._to_float() - self._shift(axis)
        e = shifted.exp()
        # one reciprocal per row and a multiply per value, as PyTorch's CPU kernel normalizes
        # (a division per value, FDIV, would be slower and no closer to torch's numbers)
        return e * e.sum(axis, keepdim=True).reciprocal()

    def log_softmax(self, axis: int = -1, dtype: DType | str | type | None = None) -> Self:
        if dtype is not None:
            return self.cast(dtypes.as_dtype(dtype)).log_softmax(axis)
        shifted = self._to_float() - self._shift(axis)
        return shifted - shifted.exp().sum(axis, keepdim=True).log()

    def _shift(self, axis: Any) -> Self:
        """The max along `axis`, subtracted before exp() so it cannot overflow. Detached: the
        result does not depend on the shift (its gradient is exactly zero), and backward would
        otherwise spend two reductions (and two kernels) computing that zero. (tinygrad
        detaches it too.)"""
        return self._to_float().max(axis, keepdim=True).detach()

    def logsumexp(self, axis: Any = None, keepdim: bool = False) -> Self:
        peak = self._shift(axis)
        peak = (peak.abs() == math.inf).where(0.0, peak)  # all -inf: the answer is -inf, not nan
        total = (self - peak).exp().sum(axis, keepdim=True).log() + peak
        return total if keepdim else total.reshape(
            tuple(s for i, s in enumerate(self.shape) if i not in self._axes(axis)))

    def logcumsumexp(self, axis: int = 0) -> Self:
        """log(cumsum(exp(x))), stably: a logsumexp over each prefix window, so every window
        subtracts its own max (one global max would underflow the early, small prefixes)."""
        if self.ndim == 0:
            return self.reshape(1).logcumsumexp(0).reshape(())
        a = self._axis(axis)
        if self.shape[a] == 0:
            return self._to_float()
        windows = self._to_float()._prefix_windows(a, -math.inf)
        return windows.logsumexp(-1).transpose(a, -1)

    # ---- normalization and dropout ----

    def layernorm(self, axis: int | Sequence[int] = -1, eps: float = 1e-5) -> Self:
        centered = self - self.mean(axis, keepdim=True)
        return centered * ((centered * centered).mean(axis, keepdim=True) + eps).rsqrt()

    def batchnorm(self, weight: Self | None, bias: Self | None, mean: Self,
                  invstd: Self, axis: int | Sequence[int] = 1) -> Self:
        axes = self._axes(axis)
        shape = tuple(s if i in axes else 1 for i, s in enumerate(self.shape))
        x = self - mean.reshape(shape)
        if weight is not None:
            x = x * weight.reshape(shape)
        x = x * (invstd.reshape(shape) if invstd.ndim == len(axes) else invstd)
        return x if bias is None else x + bias.reshape(shape)

    def dropout(self, p: float = 0.5) -> Self:
        if not 0 <= p <= 1:
            raise ValueError(f"dropout probability must be in [0, 1], got {p}")
        if not (type(self).training or TRAINING) or p == 0:
            return self
        if p == 1:
            return self.zeros_like()
        keep = type(self).rand(*self.shape, device=self.device, contiguous=False) >= p
        return keep.where(self, 0) / (1.0 - p)

    def multinomial(self, num_samples: int = 1, replacement: bool = False) -> Self:
        """Draw category indices from the weights in the last axis (one row, or one per row of
        a 2-d tensor), as int32 (tinygrad's signature, PyTorch's checks). With replacement:
        a uniform u picks the first category whose running share of the total exceeds it.
        Without: each category gets the key log2(u)/w (Efraimidis-Spirakis: an exponential
        race, the first to finish wins), and the num_samples largest keys are the draws.
        Both use tinygrad's uniforms in tinygrad's order, so a seed gives its draws."""
        if not 1 <= self.ndim <= 2:
            raise RuntimeError("prob_dist must be 1 or 2 dim")
        if not isinstance(num_samples, int) or num_samples <= 0:
            raise RuntimeError("cannot sample n_sample <= 0 samples")
        if not replacement and num_samples > self.shape[-1]:
            raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without "
                               "replacement")
        weight = (self.unsqueeze(0) if self.ndim == 1 else self).float()
        if bool((weight < 0).any().item()) or not bool(weight.isfinite().all().item()):
            raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
        if bool((weight.sum(1) <= 0).any().item()):
            raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
        rows, categories = weight.shape
        if replacement:
            cumulative = weight.cumsum(1)
            cdf = cumulative / cumulative.shrink([None, (categories - 1, categories)])
            uniform = type(self).rand(num_samples, rows, 1, device=self.device)
            picked = (uniform.expand(num_samples, rows, categories) >= cdf).cast(dtypes.int32)
            indices = picked.sum(2).minimum(categories - 1).permute(1, 0)
        else:
            uniform = type(self).rand(rows, categories, dtype=dtypes.float32, device=self.device)
            keys = uniform.log2() / weight  # a zero weight never finishes: -inf
            indices = keys.topk(num_samples, dim=1)[1]
        indices = indices.cast(dtypes.int32)
        return indices.squeeze(0) if self.ndim == 1 else indices

    # ---- losses ----

    def one_hot(self, num_classes: int = -1) -> Self:
        if dtypes.is_float(self.dtype):
            raise TypeError(f"one_hot needs integer class indices, not {self.dtype}")
        if num_classes == -1:
            num_classes = int(self.max().item()) + 1
        classes = type(self).arange(num_classes, device=self.device)
        return (self.unsqueeze(-1) == classes).where(1, 0)

    def sparse_categorical_crossentropy(self, Y: Self, ignore_index: int = -1,
                                        label_smoothing: float = 0.0,
                                        reduction: str = "mean",
                                        weight: Self | None = None) -> Self:
        """Cross-entropy of logits `self` (N, C) against integer labels Y (N,). `weight` (C,)
        weighs each class, as PyTorch's: a mean then divides by the weights of the targets."""
        if Y.shape != self.shape[:-1]:
            raise ShapeError(f"labels of shape {Y.shape} do not match logits {self.shape}")
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
        denominator: Self = counted
        if weight is not None:
            if weight.shape != (self.shape[-1],):
                raise ValueError(f"class weight of shape {weight.shape} does not match the "
                                 f"{self.shape[-1]} classes")
            weights = weights * weight
            denominator = (picked & kept).where(weight, 0)
        per_class = -(log_probs * weights)
        if reduction == "none":
            return per_class.sum(-1)
        # one sum over items and classes at once: a sum of per-item sums would be two kernels
        # (a reduction that feeds another reduction is stored)
        return _reduce_loss(per_class, reduction, denominator)

    def cross_entropy(self, Y: Self, reduction: str = "mean", label_smoothing: float = 0.0,
                      ignore_index: int = -1, weight: Self | None = None) -> Self:
        """Cross-entropy of logits against class indices or class probabilities, as PyTorch's:
        the classes are axis 1 of (N, C, d1, ...) logits (axis 0 of unbatched (C,) ones), the
        indices have the logits' shape without it, probabilities the logits' own shape.
        `label_smoothing` mixes the target with the uniform distribution: (1 - s) * target +
        s / C. Items whose index is `ignore_index` count for nothing (tinygrad's default -1;
        PyTorch's is -100). `weight` (C,) weighs each class (PyTorch's)."""
        if not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
        classes = 0 if self.ndim == 1 else 1
        if Y.shape != self.shape or not dtypes.is_float(Y.dtype):
            # classes last, where sparse_categorical_crossentropy looks for them
            logits = self.permute(*(a for a in range(self.ndim) if a != classes), classes)
            return logits.sparse_categorical_crossentropy(Y, ignore_index, label_smoothing,
                                                          reduction, weight)
        target = Y * (1 - label_smoothing) + label_smoothing / self.shape[classes]
        if weight is not None:
            target = target * weight.reshape(-1, *([1] * (self.ndim - classes - 1)))
        loss = -(self.log_softmax(classes) * target).sum(classes)
        return _reduce_loss(loss, reduction)

    def binary_crossentropy(self, Y: Self, reduction: str = "mean") -> Self:
        """For probabilities `self` in (0, 1); logs are clipped at -100 as PyTorch does."""
        log_p = self.log().maximum(-100)
        log_not_p = (1 - self).log().maximum(-100)
        return _reduce_loss(-(Y * log_p + (1 - Y) * log_not_p), reduction)

    def binary_crossentropy_logits(self, Y: Self, reduction: str = "mean",
                                   pos_weight: Self | None = None) -> Self:
        """-(pos_weight * y * log sigmoid(x) + (1 - y) * log(1 - sigmoid(x))), PyTorch's
        BCEWithLogits; `pos_weight` (broadcast over the last axis) weighs the positives."""
        # log(sigmoid(x)) = -softplus(-x) and log(1 - sigmoid(x)) = -softplus(x), written
        # stably with softplus(x) = max(x, 0) + log(1 + e^-|x|) and softplus(-x) = that - x.
        # At x = 0 the kinks must add up to the true gradient (1 - y - pos_weight * y) / 2:
        # abs contributes 0 there, and maximum splits a tie, contributing 0.5.
        tail = (1 + (-self.abs()).exp()).log()
        softplus = self.maximum(0) + tail
        if pos_weight is None:
            return _reduce_loss(softplus - self * Y, reduction)
        loss = (1 - Y) * softplus + pos_weight * Y * (softplus - self)
        return _reduce_loss(loss, reduction)

    # ---- einsum: permute every operand to one letter order, broadcast, multiply, sum ----

    @classmethod
    def einsum(cls, formula: str, *operands: Any, dtype: DType | None = None) -> Self:
        """Einstein summation, e.g. `Tensor.einsum("ij,jk->ik", a, b)` is a @ b. Without "->"
        the output letters are those used once, in alphabetical order (numpy's rule). A letter
        repeated in one operand takes its diagonal ("ii->i"). "..." stands for the axes no
        letter names, broadcast across operands (aligned from the right, as numpy's
        broadcasting; so is an axis of size 1); without "->" they come first in the output, and
        an output without "..." sums them. Each operand is permuted to one common letter order
        with size-1 axes for its missing letters; the broadcast product is summed over the
        letters not in the output."""
        tensors: list[Self] = list(operands[0]) if len(operands) == 1 and isinstance(
            operands[0], (list, tuple)) else list(operands)
        formula = _spell_out_ellipsis(formula.replace(" ", ""), [t.ndim for t in tensors])
        inputs, output = _parse_einsum(formula, len(tensors))
        prepared = [_einsum_diagonals(letters, t) for letters, t in zip(inputs, tensors)]
        sizes = _einsum_sizes(prepared)
        order = sorted(sizes)
        product: Self | None = None
        for letters, tensor in prepared:
            own = dict(zip(letters, tensor.shape))
            moved = tensor.permute([letters.index(c) for c in order if c in letters])
            aligned = moved.reshape([own.get(c, 1) for c in order])
            product = aligned if product is None else product * aligned
        assert product is not None
        product = product.expand([sizes[c] for c in order])  # an operand alone may hold a 1
        summed = [i for i, c in enumerate(order) if c not in output]
        kept = [c for c in order if c in output]
        result = product.sum(summed, dtype=dtype) if summed else product
        return result.reshape([sizes[c] for c in kept]).permute([kept.index(c) for c in output])

    # ---- functional layers ----

    def sequential(self, ll: Sequence[Callable[[Self], Self]]) -> Self:
        """Apply the layers (any callables) one after the other: ll[-1](...ll[0](self))."""
        result = self
        for layer in ll:
            result = layer(result)
        return result

    def rmsnorm(self, axis: int | Sequence[int] = -1, eps: float = 1e-6) -> Self:
        """x / sqrt(mean(x^2) + eps) over `axis` (no weight: nn.RMSNorm multiplies it in)."""
        return self * ((self * self).mean(axis, keepdim=True) + eps).rsqrt()

    def scaled_dot_product_attention(self, key: Self, value: Self,
                                     attn_mask: Self | None = None, dropout_p: float = 0.0,
                                     is_causal: bool = False, enable_gqa: bool = False,
                                     scale: float | None = None) -> Self:
        """softmax(q k^T / sqrt(d) + mask) v, with self as the queries (..., L, d), key (..., S, d)
        and value (..., S, dv). A bool attn_mask keeps the True positions; a float one is
        added. is_causal keeps key j <= query i. enable_gqa repeats the key/value heads (axis
        -3) to match the query heads. `scale` replaces 1/sqrt(d) (PyTorch's). dropout_p drops
        attention weights only in training mode (tinygrad's rule; PyTorch's function drops
        them whenever dropout_p > 0)."""
        if is_causal and attn_mask is not None:
            raise ArgumentError("scaled_dot_product_attention: give attn_mask or is_causal, "
                                "not both")
        if key.shape[-1] != self.shape[-1] or key.shape[-2] != value.shape[-2]:
            raise ShapeError(f"scaled_dot_product_attention: query {self.shape}, key "
                             f"{key.shape} and value {value.shape} do not fit together")
        if enable_gqa and key.ndim >= 3 and key.shape[-3] != self.shape[-3]:
            repeats = self.shape[-3] // key.shape[-3]
            key, value = key.repeat_interleave(repeats, -3), value.repeat_interleave(repeats, -3)
        factor = 1 / math.sqrt(self.shape[-1]) if scale is None else scale
        scores = self.matmul(key.transpose(-1, -2)) * factor
        if is_causal:
            length, source = self.shape[-2], key.shape[-2]
            attn_mask = type(self).ones(length, source, dtype=dtypes.bool,
                                        device=self.device).tril()
        if attn_mask is not None:
            if attn_mask.dtype == dtypes.bool:
                scores = attn_mask.where(scores, -math.inf)
            else:
                scores = scores + attn_mask
        return scores.softmax(-1).dropout(dropout_p).matmul(value)

    # ---- more losses ----

    def nll_loss(self, Y: Self, weight: Self | None = None, ignore_index: int | None = None,
                 reduction: str = "mean") -> Self:
        """The negative log-likelihood of log-probabilities self (N, C, ...) at the integer
        targets Y (N, ...), as PyTorch's: -weight[y] * self[n, y], averaged over the weights
        of the targets that are not ignore_index (None: none is ignored, tinygrad's default;
        PyTorch's is -100)."""
        expected = () if self.ndim == 1 else self.shape[:1] + self.shape[2:]
        if self.ndim < 1 or Y.shape != expected:
            raise ValueError(f"nll_loss: targets of shape {Y.shape} do not fit inputs "
                             f"{self.shape} (N, C, ...) or (C,), which need targets (N, ...) "
                             f"or ()")
        if dtypes.is_float(Y.dtype):
            raise TypeError(f"nll_loss needs integer targets, not {Y.dtype.name}")
        classes = self.shape[1] if self.ndim > 1 else self.shape[0]
        axis = 1 if self.ndim > 1 else 0
        column = [1] * self.ndim
        column[axis] = classes
        arange = type(self).arange(classes, device=self.device).reshape(column)
        picked = Y.unsqueeze(axis) == arange                     # one-hot, (N, C, ...)
        weights = picked.cast(self.dtype) if weight is None else picked.where(
            weight.reshape(column), 0.0)
        counted = Y != ignore_index if ignore_index is not None else Y.ones_like(dtype=dtypes.bool)
        weights = weights * counted.unsqueeze(axis)
        loss = -(self * weights).sum(axis)
        if reduction == "mean":
            return loss.sum() / weights.sum()
        return _reduce_loss(loss, reduction)


def _reduce_loss(loss: N, reduction: str, counted: N | None = None) -> N:
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    if reduction == "mean":
        return loss.sum() / counted.sum() if counted is not None else loss.mean()
    raise ValueError(f"reduction must be 'mean', 'sum' or 'none', not {reduction!r}")


def _parse_einsum(formula: str, count: int) -> tuple[list[str], str]:
    """"ij,jk->ik" -> (["ij", "jk"], "ik"); without "->", the letters used once, sorted."""
    left, arrow, right = formula.partition("->")
    inputs = left.split(",")
    if len(inputs) != count:
        raise ValueError(f"einsum: {formula!r} names {len(inputs)} operands, {count} given")
    letters = "".join(inputs)
    if not all(c.isalpha() for c in letters + right):
        raise ValueError(f"einsum: {formula!r} may only hold letters, ',' and '->'")
    if not arrow:
        right = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    if len(set(right)) != len(right) or any(c not in letters for c in right):
        raise ValueError(f"einsum: output {right!r} repeats a letter or names one no input has")
    return inputs, right


def _spell_out_ellipsis(formula: str, ranks: list[int]) -> str:
    """Write each "..." as letters of its own: "...ij,jk" with ranks (4, 2) -> "ABij,jk->ABik"
    (fresh letters, one per axis, the last ones shared by operands with fewer axes)."""
    if "." not in formula:
        return formula
    left, arrow, right = formula.partition("->")
    inputs = left.split(",")
    if any(part.count(".") not in (0, 3) or (part.count(".") and "..." not in part)
           for part in inputs + [right]):
        raise ArgumentError(f"einsum: a '.' must be part of one '...' per operand (in {formula!r})")
    if len(inputs) != len(ranks):
        raise ValueError(f"einsum: {formula!r} names {len(inputs)} operands, {len(ranks)} given")
    named = [len(part.replace("...", "")) for part in inputs]
    hidden = [rank - count if "..." in part else 0
              for part, rank, count in zip(inputs, ranks, named)]
    if any(h < 0 for h in hidden):
        raise ShapeError(f"einsum: {formula!r} names more axes than an operand's shape has")
    fresh = [c for c in string.ascii_letters if c not in formula][:max(hidden)]
    spelled = [part.replace("...", "".join(fresh[len(fresh) - h:]) if h else "")
               for part, h in zip(inputs, hidden)]
    if not arrow:
        letters = "".join(part.replace("...", "") for part in inputs)
        right = "..." + "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    return ",".join(spelled) + "->" + right.replace("...", "".join(fresh))


def _einsum_sizes(operands: list[tuple[str, N]]) -> dict[str, int]:
    """Each letter's size, checked: one size per letter (or 1, which broadcasts, as PyTorch)."""
    sizes: dict[str, int] = {}
    for letters, tensor in operands:
        for letter, size in zip(letters, tensor.shape):
            known = sizes.setdefault(letter, size)
            if known != size and 1 not in (known, size):
                raise ShapeError(f"einsum: letter {letter!r} has sizes {known} and {size}")
            sizes[letter] = max(known, size) if 1 in (known, size) else size
    return sizes


def _einsum_diagonals(letters: str, tensor: N) -> tuple[str, N]:
    """A letter twice in one operand ("ii") keeps the diagonal of those two axes."""
    if len(letters) != tensor.ndim:
        raise ShapeError(f"einsum: operand {letters!r} has shape {tensor.shape}")
    while len(set(letters)) != len(letters):
        letter = next(c for c in letters if letters.count(c) > 1)
        first = letters.index(letter)
        second = letters.index(letter, first + 1)
        if tensor.shape[first] != tensor.shape[second]:
            raise ShapeError(f"einsum: letter {letter!r} has sizes {tensor.shape[first]} and "
                             f"{tensor.shape[second]}")
        tensor = tensor.diagonal(0, first, second)  # the diagonal becomes the last axis
        letters = letters[:first] + letters[first + 1:second] + letters[second + 1:] + letter
    return letters, tensor

def _resample_axis(x: N, out: int, mode: str, align_corners: bool) -> N:
    """Resample the last axis of x (size n) to `out` elements (see Tensor.interpolate)."""
    n = x.shape[-1]
    o = type(x).arange(out, device=x.device).cast(x.dtype).reshape(out, 1)
    column = type(x).arange(n, device=x.device).cast(x.dtype).reshape(1, n)
    rows = x.unsqueeze(-2)                                    # (..., 1, n)
    if mode != "linear":
        start = o + 0.5 if mode == "nearest-exact" else o
        nearest = (start * (n / out)).floor().minimum(n - 1)
        return (column == nearest).where(rows, 0.0).sum(-1)
    if align_corners:
        source = o * ((n - 1) / (out - 1)) if out > 1 else o * 0.0
    else:
        source = ((o + 0.5) * (n / out) - 0.5).maximum(0.0)
    low = source.floor()
    high = (low + 1).minimum(n - 1)
    weight = source - low
    mixed = (column == low).where(rows * (1 - weight), 0.0) + \
        (column == high).where(rows * weight, 0.0)
    return mixed.sum(-1)

def _resample_uint8_axis(x: N, out: int, align_corners: bool) -> N:
    """Linear resampling of a uint8 axis in integers, as PyTorch's uint8 kernel computes it
    (and so, bit for bit, its results): the two weights of each output are rounded to
    fixed point with the most fraction bits that keep the largest weight in an int16, the
    weighted sum rounds to the nearest integer, and each axis's result is a uint8 again."""
    n = x.shape[-1]
    o = np.arange(out, dtype=np.float64)
    if align_corners:
        source = o * ((n - 1) / (out - 1)) if out > 1 else o * 0.0
    else:
        source = np.maximum((o + 0.5) * (n / out) - 0.5, 0.0)
    low = np.floor(source).astype(np.int64)
    high = np.minimum(low + 1, n - 1)
    weights = (1 - (source - low), source - low)
    bits = _int16_weight_bits(max(float(w.max()) for w in weights))
    matrix = np.zeros((n, out), dtype=np.int32)  # input i's share of output o
    for index, weight in ((low, weights[0]), (high, weights[1])):
        np.add.at(matrix, (index, np.arange(out)), np.floor(weight * (1 << bits) + 0.5))
    shares = type(x)(matrix, device=x.device, dtype=dtypes.int32)
    total = (x.cast(dtypes.int32).unsqueeze(-1) * shares).sum(-2) + (1 << (bits - 1))
    return (total // (1 << bits)).clip(0, 255).cast(dtypes.uint8)


def _int16_weight_bits(largest: float) -> int:
    """The fraction bits for weights up to `largest` that still fit an int16 (PyTorch's)."""
    bits = 0
    while bits < 22 and int(0.5 + largest * (1 << (bits + 1))) < (1 << 15):
        bits += 1
    return bits


SVD_SWEEPS = 30  # at most this many Jacobi sweeps over all column pairs
SVD_TOLERANCE = 1e-7  # done when every pair of columns has |cos(angle)| below this


def _part(x: N, axis: int, start: int, end: int) -> N:
    """x[..., start:end, ...] along one axis (a shrink: indexing is a part above this one)."""
    bounds: list[tuple[int, int] | None] = [None] * x.ndim
    bounds[axis] = (start, end)
    return x.shrink(bounds)


def _off_diagonal(u: N) -> float:
    """The largest |cosine| between two distinct columns of u (0: all orthogonal)."""
    gram = u.transpose(-2, -1) @ u
    lengths = gram.diagonal(dim1=-2, dim2=-1).maximum(1e-30).sqrt()
    cosine = gram / (lengths.unsqueeze(-1) * lengths.unsqueeze(-2))
    n = u.shape[-1]
    off = 1 - type(u).eye(n, dtype=u.dtype, device=u.device)
    return float((cosine.abs() * off).max().item())


def _jacobi_rotation(u: N, unit_p: N, unit_q: N) -> N:
    """The n x n rotation (batched) that makes columns p and q of u orthogonal (`unit_p`,
    `unit_q`: one-hot vectors of p and q): with a, b the columns' squared lengths and g their
    dot product, zeta = (b - a) / 2g, t = sign(zeta) / (|zeta| + sqrt(1 + zeta^2)),
    c = 1 / sqrt(1 + t^2), s = c t; the identity where g = 0."""
    n = u.shape[-1]
    col_p, col_q = (u * unit_p).sum(-1), (u * unit_q).sum(-1)
    a, b, g = col_p.square().sum(-1), col_q.square().sum(-1), (col_p * col_q).sum(-1)
    turn = g.abs() > 1e-30
    zeta = (b - a) / (2 * turn.where(g, 1.0))
    t = (zeta >= 0).where(1.0, -1.0) / (zeta.abs() + (1 + zeta.square()).sqrt())
    t = turn.where(t, 0.0)
    c = 1 / (1 + t.square()).sqrt()
    s = c * t
    pp_qq = unit_p.reshape(n, 1) * unit_p + unit_q.reshape(n, 1) * unit_q
    pq_qp = unit_p.reshape(n, 1) * unit_q - unit_q.reshape(n, 1) * unit_p
    scalar = (*u.shape[:-2], 1, 1)
    eye = type(u).eye(n, dtype=u.dtype, device=u.device)
    return eye + (c - 1).reshape(scalar) * pp_qq + s.reshape(scalar) * pq_qp


def _ints(value: int | Sequence[int], dims: int, what: str,
          positive: bool = True) -> tuple[int, ...]:
    """An int for every spatial axis, or one per axis (stride, dilation); `positive` checks
    that each is at least 1."""
    if isinstance(value, int):
        values: tuple[int, ...] = (value,) * dims
    elif len(value) != dims:
        group = "a pair of ints" if dims == 2 else f"{dims} ints"
        raise ValueError(f"{what}: expected an int or {group}, got {tuple(value)} (one per "
                         f"spatial axis)")
    else:
        values = tuple(int(v) for v in value)
    if positive and any(v < 1 for v in values):
        raise ValueError(f"{what} must be positive, got {values}")
    return values


def _check_conv(x: N, weight: N, bias: N | None, groups: int) -> int:
    """The shapes conv2d needs; returns the number of spatial axes."""
    if x.ndim < 3 or weight.ndim != x.ndim:
        raise ShapeError(f"conv2d needs (N, C, H, W) input and (O, C/groups, kH, kW) weight, "
                         f"or as many axes in both for another number of spatial axes, got "
                         f"{x.shape} and {weight.shape}")
    channels, (out_channels, group_channels) = x.shape[1], weight.shape[:2]
    if groups < 1 or channels != group_channels * groups or out_channels % groups:
        raise ShapeError(f"conv2d: input has {channels} channels, weight {weight.shape} with "
                         f"groups={groups} expects {group_channels * groups}")
    if bias is not None and bias.shape != (out_channels,):
        raise ShapeError(f"conv2d: bias of shape {bias.shape} does not match the "
                         f"{out_channels} output channels")
    return x.ndim - 2


def _named_padding(padding: int | str | Sequence[int], kernel: Sequence[int],
                   dilations: Sequence[int], strides: Sequence[int]) -> list[tuple[int, int]]:
    """PyTorch's padding="valid" (none) and "same" (d*(k-1) in all, the odd one at the end);
    anything else goes to _conv_padding."""
    if not isinstance(padding, str):
        return _conv_padding(padding, len(kernel))
    if padding == "valid":
        return [(0, 0)] * len(kernel)
    if padding != "same":
        raise ValueError(f"conv2d padding must be an int, ints, 'valid' or 'same', not "
                         f"{padding!r}")
    if any(s != 1 for s in strides):
        raise ValueError(f"conv2d padding='same' needs stride 1, got stride {tuple(strides)}")
    totals = [d * (k - 1) for k, d in zip(kernel, dilations)]
    return [(total // 2, total - total // 2) for total in totals]


def _check_window_fits(name: str, sizes: Sequence[int], kernel: Sequence[int],
                       dilations: Sequence[int]) -> None:
    for size, k, d in zip(sizes, kernel, dilations):
        if d * (k - 1) + 1 > size:
            raise ShapeError(f"{name}: kernel {tuple(kernel)} (dilation {tuple(dilations)}) is "
                             f"larger than the padded input {tuple(sizes)}: a window of {k} "
                             f"(spanning {d * (k - 1) + 1}) does not fit in size {size}")


def _pool_kernel(kernel_size: int | Sequence[int]) -> tuple[int, ...]:
    kernel = (kernel_size, kernel_size) if isinstance(kernel_size, int) else tuple(kernel_size)
    if not kernel or any(k < 1 for k in kernel):
        raise ValueError(f"pooling kernel_size must be positive, got {kernel_size}")
    return kernel


def _pool_padding(x: N, kernel: Sequence[int], strides: Sequence[int],
                  dilations: Sequence[int], padding: int | Sequence[int],
                  ceil_mode: bool) -> tuple[list[tuple[int, int]], list[int]]:
    """The padding of each pooled axis, and how much more `ceil_mode` adds at its end for a
    last, partial window (PyTorch's rule: that window must start inside the input or the
    left padding)."""
    if x.ndim < len(kernel):
        raise ValueError(f"pooling a {len(kernel)}-d kernel needs at least {len(kernel)} axes, "
                         f"got shape {x.shape}")
    pads = _conv_padding(padding, len(kernel))
    sizes = x.shape[-len(kernel):]
    for (before, after), k, d in zip(pads, kernel, dilations):
        if max(before, after) > (d * (k - 1) + 1) // 2:
            raise ValueError(f"pool padding {padding} must be at most half the kernel "
                             f"{tuple(kernel)}")
    _check_window_fits("pool", [n + b + a for n, (b, a) in zip(sizes, pads)], kernel, dilations)
    extra = []
    for n, (before, after), k, s, d in zip(sizes, pads, kernel, strides, dilations):
        padded, span = n + before + after, d * (k - 1) + 1
        out = (padded - span) // s + 1
        if ceil_mode:
            out = -(-(padded - span) // s) + 1
            if (out - 1) * s >= n + before:
                out -= 1
        extra.append(max(0, (out - 1) * s + span - padded))
    return pads, extra


def _check_conv_transpose(x: N, weight: N, bias: N | None, groups: int) -> None:
    """The shapes conv_transpose2d needs, each mistake with a message that names it."""
    if x.ndim < 3 or weight.ndim != x.ndim:
        raise ValueError(f"conv_transpose2d needs (N, C_in, H, W) input and (C_in, "
                         f"C_out/groups, kH, kW) weight, or as many axes in both for another "
                         f"number of spatial axes, got {x.shape} and {weight.shape}")
    in_channels, per_group = weight.shape[:2]
    if groups < 1 or in_channels % groups:
        raise ValueError(f"conv_transpose2d: weight {weight.shape} has {in_channels} input "
                         f"channels, which do not split into groups={groups}")
    if x.shape[1] != in_channels:
        raise ValueError(f"conv_transpose2d: input has {x.shape[1]} channels, weight "
                         f"{weight.shape} (C_in, C_out/groups, kH, kW) expects {in_channels}")
    if bias is not None and bias.shape != (per_group * groups,):
        raise ValueError(f"conv_transpose2d: bias of shape {bias.shape} does not match the "
                         f"{per_group * groups} output channels")


def _check_conv_transpose_sizes(image: Sequence[int], kernel: Sequence[int],
                                strides: Sequence[int], dilations: Sequence[int],
                                paddings: Sequence[int], extras: Sequence[int]) -> None:
    """PyTorch's rules: output_padding is smaller than stride or dilation (else it would add
    pixels no input reaches), and the output is at least one pixel."""
    if min(*strides, *dilations) < 1 or min(*paddings, *extras) < 0:
        raise ValueError(f"conv_transpose2d: stride {tuple(strides)} and dilation "
                         f"{tuple(dilations)} must be >= 1, padding {tuple(paddings)} and "
                         f"output_padding {tuple(extras)} >= 0")
    if any(e >= s and e >= d for e, s, d in zip(extras, strides, dilations)):
        raise ValueError(f"conv_transpose2d: output_padding {tuple(extras)} must be smaller "
                         f"than stride {tuple(strides)} or dilation {tuple(dilations)}")
    sizes = [(n - 1) * s - 2 * p + d * (k - 1) + e + 1
             for n, k, s, d, p, e in zip(image, kernel, strides, dilations, paddings, extras)]
    if min(sizes) < 1:
        raise ValueError(f"conv_transpose2d: input {tuple(image)} with padding "
                         f"{tuple(paddings)} gives an empty output {tuple(sizes)}")


def _conv_gradient_rule(cls: type, device: str, groups: int, strides: Sequence[int],
                        dilations: Sequence[int]) -> Callable[..., tuple[Any, Any]]:
    """conv2d's gradient as a whole (gradient.register_gradient), for its padded input and its
    weight: the input's is conv_transpose2d of the output's gradient with the same weight,
    stride, dilation and groups (a gather: one kernel, where the primitive rules store every
    window's gradient and then sum them into the pixels); `output_padding` adds the input's
    last rows that no window's first tap reached. The weight's is `_conv_weight_gradient`."""
    def rule(grad: Any, padded: Any, weight: Any) -> tuple[Any, Any]:
        g, x, w = (cls(node, device) for node in (grad, padded, weight))
        kernel = w.shape[2:]
        reached = [(o - 1) * s + d * (k - 1) + 1
                   for o, s, d, k in zip(g.shape[2:], strides, dilations, kernel)]
        extras = [size - r for size, r in zip(x.shape[2:], reached)]
        grad_x = g.conv_transpose2d(w, groups=groups, stride=strides, dilation=dilations,
                                    output_padding=extras)
        grad_w = x._conv_weight_gradient(g, kernel, groups, strides, dilations)
        return grad_x.uop, grad_w.uop
    return rule


def _spread(x: N, strides: Sequence[int]) -> N:
    """Insert s-1 zeros between neighbours on each spatial axis: H -> (H-1)s+1. Each pixel
    gets s-1 zeros after it (reshape to (H, 1), pad to (H, s), reshape to H*s), then the
    zeros after the last pixel are cut off."""
    for axis, step in enumerate(strides, start=2):
        if step == 1:
            continue
        size, before, after = x.shape[axis], x.shape[:axis], x.shape[axis + 1:]
        x = x.reshape(*before, size, 1, *after)
        x = x.pad([(0, 0)] * (axis + 1) + [(0, step - 1)] + [(0, 0)] * len(after))
        x = x.reshape(*before, size * step, *after)
        bounds: list[tuple[int, int] | None] = [None] * x.ndim
        bounds[axis] = (0, (size - 1) * step + 1)
        x = x.shrink(bounds)
    return x


def _conv_padding(padding: int | Sequence[int], dims: int) -> list[tuple[int, int]]:
    """PyTorch's conv padding: an int, one per spatial axis, or (left, right, top, bottom)."""
    if isinstance(padding, int):
        return [(padding, padding)] * dims
    values = list(padding)
    if len(values) == dims:
        return [(int(p), int(p)) for p in values]
    if len(values) == 2 * dims:
        return padding_pairs(values, dims)
    raise ValueError(f"padding {padding} does not fit {dims} spatial axes")




# bfloat16 softmax and log_softmax in float32, rounded once (see tensor_math.bfloat16_composed)
for _name in ("softmax", "log_softmax"):
    setattr(TensorNN, _name, in_float32_for_bfloat16(getattr(TensorNN, _name)))
