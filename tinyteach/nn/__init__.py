"""Chapter 11: Deep learning — layers are plain Python objects that hold Tensors.

What this teaches:
- a layer is a class with Tensor attributes (its parameters) and a `__call__(x)`; there is no
  Module base class. `nn.state.get_parameters(model)` finds the parameters by walking the
  attributes, so any object that holds Tensors is a model (tinygrad's design);
- each layer here is a few lines over Tensor ops that chapter 1 already built (`linear`,
  `conv2d`, `conv_transpose2d`, `layernorm`, `batchnorm`); the ones Tensor lacks — `conv1d`,
  `conv_transpose1d` — are written below from those same ops (a 2-d one of height 1), so
  autograd and every backend work for them unchanged;
- initializations follow tinygrad (which follows PyTorch): a weight with fan-in `n` is drawn
  uniformly from [-1/sqrt(n), 1/sqrt(n)], norms start at weight 1 and bias 0;
- BatchNorm keeps running statistics as Tensors that it updates with `assign` while
  `Tensor.training` (or `Context(TRAINING=1)`) is on; give them to the optimizer (for example
  `get_parameters(model)`) so `step()` realizes them together with the weights.

Builds on: tensor/. Used by: nn.optim, nn.state, the training examples.
Submodules: `nn.optim` (SGD, LARS, Muon, Adam, AdamW, LAMB, APOLLO), `nn.state` (state dicts,
safetensors, PyTorch checkpoints, tar files), `nn.datasets` (MNIST, digits).

>>> from tinyteach import Tensor, nn
>>> layer = nn.Linear(3, 2)
>>> layer(Tensor.ones(4, 3)).shape
(4, 2)
"""
from __future__ import annotations

import math
from collections.abc import Sequence

from tinyteach.dtype import dtypes
from tinyteach.helpers import prod
from tinyteach.nn import datasets, optim, state
from tinyteach.settings import TRAINING
from tinyteach.tensor import Tensor

IntOrPair = int | Sequence[int]

__all__ = ["Linear", "Conv1d", "Conv2d", "ConvTranspose1d", "ConvTranspose2d", "BatchNorm",
           "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "LayerNorm", "GroupNorm",
           "InstanceNorm", "LayerNorm2d", "RMSNorm", "Embedding", "LSTMCell", "conv1d",
           "conv_transpose1d", "conv_transpose2d", "optim", "state", "datasets"]


def _tuple(value: IntOrPair, count: int) -> tuple[int, ...]:
    """An int repeated `count` times, or a sequence of `count` ints."""
    values = (value,) * count if isinstance(value, int) else tuple(int(v) for v in value)
    if len(values) != count:
        raise ValueError(f"expected {count} values, got {value}")
    return values


def _uniform(*shape: int, bound: float) -> Tensor:
    return Tensor.uniform(*shape, low=-bound, high=bound)


# ---- linear ----

class Linear:
    """y = x @ weight.T + bias, with weight (out, in) and bias (out,).

    Both start uniform in [-1/sqrt(in), 1/sqrt(in)] (PyTorch's and tinygrad's default)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        bound = 1 / math.sqrt(in_features)
        self.weight = _uniform(out_features, in_features, bound=bound)
        self.bias = _uniform(out_features, bound=bound) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        return x.linear(self.weight.transpose(), self.bias)


# ---- convolutions ----

def _same_padding(kernel: Sequence[int], dilation: Sequence[int]) -> list[int]:
    """padding='same': d*(k-1) zeros per axis, the odd one after; flat, last axis first."""
    flat = []
    for k, d in zip(reversed(kernel), reversed(dilation)):
        total = d * (k - 1)
        flat += [total // 2, total - total // 2]
    return flat


def conv1d(x: Tensor, weight: Tensor, bias: Tensor | None = None, groups: int = 1,
           stride: int = 1, dilation: int = 1, padding: int | Sequence[int] = 0) -> Tensor:
    """1-d convolution of x (N, C, L) with weight (O, C/groups, k): a conv2d of height 1."""
    if x.ndim != 3 or weight.ndim != 3:
        raise ValueError(f"conv1d needs (N, C, L) input and (O, C/groups, k) weight, got "
                         f"{x.shape} and {weight.shape}")
    left, right = (padding, padding) if isinstance(padding, int) else _tuple(padding, 2)
    out = x.unsqueeze(2).conv2d(weight.unsqueeze(2), bias, groups, stride=(1, stride),
                                dilation=(1, dilation), padding=(left, right, 0, 0))
    return out.squeeze(2)


def conv_transpose2d(x: Tensor, weight: Tensor, bias: Tensor | None = None, groups: int = 1,
                     stride: IntOrPair = 1, dilation: IntOrPair = 1, padding: IntOrPair = 0,
                     output_padding: IntOrPair = 0) -> Tensor:
    """x.conv_transpose2d(weight, ...): see Tensor.conv_transpose2d (tensor/nn.py)."""
    return x.conv_transpose2d(weight, bias, groups, stride, dilation, padding, output_padding)


def conv_transpose1d(x: Tensor, weight: Tensor, bias: Tensor | None = None, groups: int = 1,
                     stride: int = 1, dilation: int = 1, padding: int = 0,
                     output_padding: int = 0) -> Tensor:
    """1-d transposed convolution of x (N, C_in, L) with weight (C_in, C_out/groups, k): a
    conv_transpose2d of height 1, as conv1d is a conv2d of height 1."""
    if x.ndim != 3 or weight.ndim != 3:
        raise ValueError(f"conv_transpose1d needs (N, C_in, L) input and (C_in, C_out/groups, "
                         f"k) weight, got {x.shape} and {weight.shape}")
    out = x.unsqueeze(2).conv_transpose2d(weight.unsqueeze(2), bias, groups, stride=(1, stride),
                                          dilation=(1, dilation), padding=(0, padding),
                                          output_padding=(0, output_padding))
    return out.squeeze(2)


class Conv2d:
    """y[n, o] = bias[o] + sum over c in o's group, (i, j) of weight[o, c, i, j] * x[n, c, ...]
    (a cross-correlation, as PyTorch). weight (out, in/groups, kH, kW), bias (out,), both
    uniform in ±1/sqrt(in * kH * kW) (tinygrad's scale). padding: int, pair, or 'same'."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntOrPair,
                 stride: IntOrPair = 1, padding: IntOrPair | str = 0, dilation: IntOrPair = 1,
                 groups: int = 1, bias: bool = True, dims: int = 2):
        self.kernel_size = _tuple(kernel_size, dims)
        self.stride, self.dilation, self.groups = stride, dilation, groups
        self.padding = _resolve_padding(padding, self.kernel_size, stride, dilation)
        bound = 1 / math.sqrt(in_channels * prod(self.kernel_size))
        self.weight = _uniform(out_channels, in_channels // groups, *self.kernel_size,
                               bound=bound)
        self.bias = _uniform(out_channels, bound=bound) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        return x.conv2d(self.weight, self.bias, self.groups, self.stride, self.dilation,
                        self.padding)


def _resolve_padding(padding: IntOrPair | str, kernel: tuple[int, ...], stride: IntOrPair,
                     dilation: IntOrPair) -> IntOrPair:
    if not isinstance(padding, str):
        return padding
    if padding.lower() != "same":
        raise ValueError(f"padding must be an int, a sequence or 'same', not {padding!r}")
    if any(s != 1 for s in _tuple(stride, len(kernel))):
        raise ValueError("padding='same' needs stride 1 (as in PyTorch)")
    return _same_padding(kernel, _tuple(dilation, len(kernel)))


class Conv1d(Conv2d):
    """Conv2d over one spatial axis: x (N, C, L), weight (out, in/groups, k)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1,
                 padding: int | str = 0, dilation: int = 1, groups: int = 1, bias: bool = True):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, dims=1)

    def __call__(self, x: Tensor) -> Tensor:
        stride, dilation = _tuple(self.stride, 1)[0], _tuple(self.dilation, 1)[0]
        return conv1d(x, self.weight, self.bias, self.groups, stride, dilation, self.padding)


class ConvTranspose2d:
    """The transpose of Conv2d (see Tensor.conv_transpose2d): weight (in, out/groups, kH, kW)
    and bias (out,), uniform in ±1/sqrt(in * kH * kW) (tinygrad's scale, as Conv2d)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntOrPair,
                 stride: IntOrPair = 1, padding: IntOrPair = 0, output_padding: IntOrPair = 0,
                 dilation: IntOrPair = 1, groups: int = 1, bias: bool = True, dims: int = 2):
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"{in_channels} in and {out_channels} out channels do not both "
                             f"split into groups={groups}")
        self.kernel_size = _tuple(kernel_size, dims)
        self.stride, self.padding, self.output_padding = stride, padding, output_padding
        self.dilation, self.groups = dilation, groups
        bound = 1 / math.sqrt(in_channels * prod(self.kernel_size))
        # tinygrad's ConvTranspose2d runs Conv2d's __init__ first, which draws a weight of
        # Conv2d's shape (dropped) and the bias; the same draws here give tinygrad's numbers
        _uniform(out_channels, in_channels // groups, *self.kernel_size, bound=bound)
        self.bias = _uniform(out_channels, bound=bound) if bias else None
        self.weight = _uniform(in_channels, out_channels // groups, *self.kernel_size,
                               bound=bound)

    def __call__(self, x: Tensor) -> Tensor:
        return x.conv_transpose2d(self.weight, self.bias, self.groups, self.stride,
                                  self.dilation, self.padding, self.output_padding)


class ConvTranspose1d(ConvTranspose2d):
    """ConvTranspose2d over one spatial axis: x (N, C_in, L), weight (in, out/groups, k)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1,
                 padding: int = 0, output_padding: int = 0, dilation: int = 1, groups: int = 1,
                 bias: bool = True):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding,
                         output_padding, dilation, groups, bias, dims=1)

    def __call__(self, x: Tensor) -> Tensor:
        one = [_tuple(value, 1)[0] for value in (self.stride, self.dilation, self.padding,
                                                 self.output_padding)]
        return conv_transpose1d(x, self.weight, self.bias, self.groups, *one)


# ---- normalization ----

def _per_channel(t: Tensor, ndim: int) -> Tensor:
    """A (C,) tensor shaped (1, C, 1, ...) to broadcast over (N, C, ...)."""
    return t.reshape(1, -1, *[1] * (ndim - 2))


def _buffer(initial: Tensor) -> Tensor:
    """State that is not trained (requires_grad=False), so an optimizer only realizes it."""
    result = initial.contiguous()
    result.requires_grad = False
    return result


class BatchNorm:
    """y = (x - mean) / sqrt(var + eps) * weight + bias, per channel (axis 1).

    Training (`Tensor.training` or TRAINING=1), or track_running_stats=False: mean and var are
    the batch's (biased var) over every axis but 1, and — when tracking — the running stats
    move towards them: running = (1 - momentum) * running + momentum * batch, using the
    unbiased batch variance for running_var (as PyTorch). Evaluation: the running stats."""

    def __init__(self, sz: int, eps: float = 1e-5, affine: bool = True,
                 track_running_stats: bool = True, momentum: float = 0.1):
        self.eps, self.momentum, self.track_running_stats = eps, momentum, track_running_stats
        self.weight: Tensor | None = Tensor.ones(sz) if affine else None
        self.bias: Tensor | None = Tensor.zeros(sz) if affine else None
        if track_running_stats:
            self.running_mean = _buffer(Tensor.zeros(sz))
            self.running_var = _buffer(Tensor.ones(sz))
            # tinygrad: shape (1,) and int64 where supported; PyTorch: shape (), int64
            self.num_batches_tracked = _buffer(Tensor.zeros((), dtype=dtypes.int32))

    def calc_stats(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The mean and (biased) variance to normalize with, each of shape (C,)."""
        if self.track_running_stats and not (Tensor.training or TRAINING):
            return self.running_mean, self.running_var
        mean = _staged_mean(x)
        centered = x - _per_channel(mean.detach(), x.ndim)  # d(var)/d(mean) is 0 anyway
        return mean, _staged_mean(centered * centered)

    def __call__(self, x: Tensor) -> Tensor:
        mean, var = self.calc_stats(x)
        if self.track_running_stats and (Tensor.training or TRAINING):
            self._update_running_stats(x, mean.detach(), var.detach())
        return x.batchnorm(self.weight, self.bias, mean, (var + self.eps).rsqrt())

    def _update_running_stats(self, x: Tensor, mean: Tensor, var: Tensor) -> None:
        count = x.numel() // x.shape[1]
        unbiased = var * (count / max(count - 1, 1))
        momentum = self.momentum
        self.running_mean.assign((1 - momentum) * self.running_mean + momentum * mean)
        self.running_var.assign((1 - momentum) * self.running_var + momentum * unbiased)
        self.num_batches_tracked.assign(self.num_batches_tracked + 1)


def _staged_mean(x: Tensor) -> Tensor:
    """The mean of x over every axis but 1, in two stages: over the pixels of each sample,
    then over the batch. A float32 sum in one loop of N values rounds N times in a chain
    (relative error ~1e-5 for BatchNorm's 51,200 values a channel at batch 128); two stages
    of 400 and 128 round about 100x less, as PyTorch's cascaded sums do. It matters here
    because BatchNorm divides by sqrt(var + eps): a channel of small variance multiplies the
    error by up to 1/sqrt(eps) = 316, and the gradients of the layers before it were 3% off."""
    inner = tuple(range(2, x.ndim))
    return (x.mean(inner) if inner else x).mean(0)


BatchNorm1d = BatchNorm2d = BatchNorm3d = BatchNorm


class LayerNorm:
    """y = (x - mean) / sqrt(var + eps) * weight + bias, with mean and (biased) var over the
    last len(normalized_shape) axes; weight (ones) and bias (zeros) have normalized_shape."""

    def __init__(self, normalized_shape: int | Sequence[int], eps: float = 1e-5,
                 elementwise_affine: bool = True):
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else normalized_shape
        self.normalized_shape = tuple(int(s) for s in shape)
        self.axis = tuple(-1 - i for i in range(len(self.normalized_shape)))
        self.eps, self.elementwise_affine = eps, elementwise_affine
        self.weight = Tensor.ones(*self.normalized_shape) if elementwise_affine else None
        self.bias = Tensor.zeros(*self.normalized_shape) if elementwise_affine else None

    def __call__(self, x: Tensor) -> Tensor:
        if x.shape[-len(self.normalized_shape):] != self.normalized_shape:
            raise ValueError(f"LayerNorm{self.normalized_shape} got input of shape {x.shape}")
        x = x.layernorm(self.axis, self.eps)
        if self.weight is None or self.bias is None:
            return x
        return x * self.weight + self.bias


class LayerNorm2d(LayerNorm):
    """LayerNorm over the channels of an image batch (N, C, H, W): each pixel's C values are
    normalized on their own (as in ConvNeXt), by moving C last, normalizing, moving it back.
    Built as LayerNorm(C): weight and bias have shape (C,)."""

    def __call__(self, x: Tensor) -> Tensor:
        if x.ndim != 4:
            raise ValueError(f"LayerNorm2d needs (N, C, H, W) input, got shape {x.shape}")
        return super().__call__(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class GroupNorm:
    """Split the C channels into num_groups groups; normalize each (sample, group) over its
    channels and positions; then y = x_hat * weight[c] + bias[c] per channel."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5,
                 affine: bool = True):
        if num_channels % num_groups:
            raise ValueError(f"{num_channels} channels do not split into {num_groups} groups")
        self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
        self.weight = Tensor.ones(num_channels) if affine else None
        self.bias = Tensor.zeros(num_channels) if affine else None

    def __call__(self, x: Tensor) -> Tensor:
        grouped = x.reshape(x.shape[0], self.num_groups, -1)
        x = grouped.layernorm(eps=self.eps).reshape(x.shape)
        if self.weight is None or self.bias is None:
            return x
        return x * _per_channel(self.weight, x.ndim) + _per_channel(self.bias, x.ndim)


class InstanceNorm:
    """Normalize each (sample, channel) over its positions, then y = x_hat * weight + bias.
    tinygrad's default affine=True (PyTorch's InstanceNorm2d defaults to affine=False)."""

    def __init__(self, num_features: int, eps: float = 1e-5, affine: bool = True):
        self.num_features, self.eps = num_features, eps
        self.weight = Tensor.ones(num_features) if affine else None
        self.bias = Tensor.zeros(num_features) if affine else None

    def __call__(self, x: Tensor) -> Tensor:
        per_instance = x.reshape(x.shape[0], self.num_features, -1)
        x = per_instance.layernorm(eps=self.eps).reshape(x.shape)
        if self.weight is None or self.bias is None:
            return x
        return x * _per_channel(self.weight, x.ndim) + _per_channel(self.bias, x.ndim)


class RMSNorm:
    """y = x / sqrt(mean(x^2 over the last axis) + eps) * weight — LayerNorm without the mean,
    computed in float32 at least, then cast back to x's dtype."""

    def __init__(self, dim: int, eps: float = 1e-6, elementwise_affine: bool = True):
        self.eps = eps
        self.weight = Tensor.ones(dim) if elementwise_affine else None

    def __call__(self, x: Tensor) -> Tensor:
        wide = x.float() if x.dtype != dtypes.float64 else x
        normed = (wide * ((wide * wide).mean(-1, keepdim=True) + self.eps).rsqrt()).cast(x.dtype)
        return normed if self.weight is None else normed * self.weight


# ---- embedding ----

class Embedding:
    """out[..., :] = weight[idx[...], :] — written as a one-hot matrix product, so its gradient
    is an ordinary matmul. weight (vocab_size, embed_size), glorot-uniform like tinygrad."""

    def __init__(self, vocab_size: int, embed_size: int):
        self.vocab_sz, self.embed_sz = vocab_size, embed_size
        self.weight = Tensor.glorot_uniform(vocab_size, embed_size)

    def __call__(self, idx: Tensor) -> Tensor:
        classes = Tensor.arange(self.vocab_sz, device=self.weight.device)
        one_hot = (idx.unsqueeze(-1) == classes).cast(self.weight.dtype)
        return one_hot @ self.weight



# ---- recurrent ----

class LSTMCell:
    """One step of a long short-term memory cell (Hochreiter and Schmidhuber, 1997).

    With gates = x @ weight_ih.T + bias_ih + h @ weight_hh.T + bias_hh, split in four along the
    last axis into (i, f, g, o):
        c' = sigmoid(f) * c + sigmoid(i) * tanh(g)        h' = sigmoid(o) * tanh(c')
    `cell(x, (h, c))` returns `(h', c')`; without a state it starts from zeros. The weights
    (4*hidden, input) and (4*hidden, hidden) are uniform in ±1/sqrt(hidden), as PyTorch's;
    tinygrad starts the biases at zero (PyTorch draws them like the weights)."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True):
        bound = 1 / math.sqrt(hidden_size)
        self.weight_ih = _uniform(hidden_size * 4, input_size, bound=bound)
        self.weight_hh = _uniform(hidden_size * 4, hidden_size, bound=bound)
        self.bias_ih: Tensor | None = Tensor.zeros(hidden_size * 4) if bias else None
        self.bias_hh: Tensor | None = Tensor.zeros(hidden_size * 4) if bias else None

    def __call__(self, x: Tensor,
                 hc: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        input_size, hidden_size = self.weight_ih.shape[1], self.weight_hh.shape[1]
        if x.ndim != 2 or x.shape[1] != input_size:
            raise ValueError(f"LSTMCell({input_size}, {hidden_size}) needs input of shape "
                             f"(batch, {input_size}), got {x.shape}")
        if hc is None:
            zeros = Tensor.zeros(x.shape[0], hidden_size, dtype=x.dtype, device=x.device)
            hc = (zeros, zeros)
        h, c = hc
        gates = x.linear(self.weight_ih.T, self.bias_ih) + h.linear(self.weight_hh.T,
                                                                    self.bias_hh)
        i, f, g, o = gates.chunk(4, dim=1)
        new_c = f.sigmoid() * c + i.sigmoid() * g.tanh()
        new_h = o.sigmoid() * new_c.tanh()
        return new_h.contiguous(), new_c.contiguous()
