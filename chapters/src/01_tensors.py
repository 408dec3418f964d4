# %% [markdown] id="tensors-01"
# # Chapter 1 — Tensors: a PyTorch-like API from 29 primitive ops
#
# A `Tensor` looks like a numpy array or a PyTorch tensor. This chapter shows what it really
# is: a handle on a **lazy graph** of a few primitive operations.
#
# **What you will learn**
# - tensors are lazy: an expression builds a graph; `realize()`, `numpy()`, `item()` and
#   `tolist()` run it;
# - the whole API — `exp`, `softmax`, matmul, indexing, even random numbers — is composed from
#   29 primitive ops;
# - broadcasting and dtype promotion happen once, in the Tensor layer, before the graph is built;
# - indexing is made of movement ops, and random numbers come from a small integer cipher
#   (threefry, tinygrad's generator, bit for bit).
#
# **Where it lives:** [`tinyteach/tensor/core.py`](../tinyteach/tensor/core.py) (the core:
# the lazy graph, the primitive elementwise, movement and reduction ops, `backward`),
# [`tinyteach/dtype.py`](../tinyteach/dtype.py) (dtypes and promotion), and the rest of the
# API in layers, each a class that inherits the one before it and uses only what is below it:
# [`tensor/create.py`](../tinyteach/tensor/create.py) (`ones`, `arange`, random numbers),
# [`tensor/movement.py`](../tinyteach/tensor/movement.py) (`transpose`, `cat`, `split`),
# [`tensor/math.py`](../tinyteach/tensor/math.py) (`exp`, `relu`, `mean`, `cumsum`),
# [`tensor/nn.py`](../tinyteach/tensor/nn.py) (matmul, `conv2d`, `softmax`, losses) and
# [`tensor/indexing.py`](../tinyteach/tensor/indexing.py) (`t[...]`).
# [`tinyteach/tensor/__init__.py`](../tinyteach/tensor/__init__.py) assembles them into `Tensor`.

# %% id="tensors-02"
import numpy as np

from tinyteach import Device, GlobalCounters, Tensor, dtypes

Device.DEFAULT = "CPU"      # the book's outputs must not depend on which devices exist here
Tensor.manual_seed(0)       # random tensors: the same numbers on every run
rng = np.random.default_rng(0)
# %load_ext tinyteach

# %% [markdown] id="tensors-03"
# ## Making tensors
#
# From a (nested) list, a numpy array, or a creation function. A tensor has a shape, a dtype
# and a device; `.numpy()` and `.tolist()` bring the values back to Python.

# %% id="tensors-04"
a = Tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
b_np = rng.standard_normal((2, 3)).astype(np.float32)
b = Tensor(b_np)
print(a.shape, a.dtype, a.device)
assert np.array_equal(b.numpy(), b_np)
Tensor.ones(2, 3).tolist(), Tensor.arange(5).tolist()

# %% [markdown] id="tensors-05"
# ## Laziness: building is not computing
#
# Arithmetic on tensors only records what to do. `GlobalCounters.kernel_count` counts the
# kernels that actually ran:

# %% id="tensors-06"
GlobalCounters.reset()
c = ((a + b) * 2).relu()
print("kernels run:", GlobalCounters.kernel_count)
c   # the extension shows a lazy tensor's state: how many kernels realizing it would run

# %% [markdown] id="tensors-07"
# Behind `c` is a graph of `UOp` nodes (chapter 3). Printed one node per line, sources first:

# %% id="tensors-08"
print(c.uop)

# %% [markdown] id="tensors-09"
# `realize()` computes it: the graph is scheduled into kernels (here one fused kernel), compiled
# and run, and `c` now points at a buffer holding the result.

# %% id="tensors-10"
c.realize()
print("kernels run:", GlobalCounters.kernel_count)
print(c.uop)
assert np.allclose(c.numpy(), np.maximum((a.numpy() + b_np) * 2, 0))

# %% [markdown] id="tensors-11"
# Laziness is what makes *fusion* possible: because nothing ran while the expression was
# built, the whole of `((a + b) * 2).relu()` became one loop over the elements instead of three
# passes over memory.
#
# ## 29 primitive ops
#
# These are the backend contract, pinned in [`ir/uop.py`](../tinyteach/ir/uop.py): a new device only
# has to implement them. A Tensor's graph may also hold three nodes that are not computation —
# `DETACH` (from `detach()`: stop gradients here), `CONTIGUOUS` (from `contiguous()`: store this
# value in a fresh buffer) and `ASSIGN` (from `assign()`: write into an existing buffer). They
# tell autograd and the scheduler (chapters 2 and 6) what to do, and are gone before a kernel
# reaches a device.

# %% id="tensors-12"
from tinyteach.ir.uop import BINARY, MOVEMENT, PRIMITIVE_OPS, REDUCE_OPS, SOURCES, TERNARY, UNARY

groups = {"sources": SOURCES, "unary": UNARY, "binary": BINARY, "ternary": TERNARY,
          "reduce": REDUCE_OPS, "movement": MOVEMENT}
for name, ops in groups.items():
    print(f"{name:>9}: {', '.join(op.name for op in ops)}")
assert len(PRIMITIVE_OPS) == 29


# %% [markdown] id="tensors-13"
# So where are `exp`, `sigmoid`, `-` and matmul? They are *compositions*. A small helper
# lists the ops a tensor's graph uses:

# %% id="tensors-14"
def ops_used(t: Tensor) -> list[str]:
    return sorted({node.op.name for node in t.uop.toposort} - {"BUFFER", "CONST"})

x = Tensor([[0.5, -1.0, 2.0]])
for name, t in [("x - 1", x - 1), ("x / 3", x / 3), ("exp", x.exp()), ("relu", x.relu()),
                ("sigmoid", x.sigmoid()), ("cos", x.cos()), ("matmul", x @ Tensor.ones(3, 2)),
                ("softmax", x.softmax())]:
    print(f"{name:>8}: {ops_used(t)}")

# %% [markdown] id="tensors-15"
# Read them as identities: `x - 1 = x + (-1)`, `eˣ = 2^(x·log₂e)`,
# `relu(x) = where(x < 0, 0, x)`, `cos x = sin(π/2 − x)`, `σ(x) = 1/(1 + e⁻ˣ)` written from
# `e = e^(−|x|)` as `where(x ≥ 0, 1/(1 + e), e/(1 + e))` (so that no `e⁻ˣ` overflows to inf
# at x = −100 and turns the gradient into NaN; `≥` is `<`, `≠` and `OR`, so that NaN ≥ 0 is
# false), and a matmul is a broadcast multiply
# followed by a sum (`EXPAND`, `MUL`, `REDUCE_AXIS`). Division is not composed: `x / 3` is the
# primitive `FDIV`, the quotient rounded once, as numpy's and PyTorch's `/`. `x · 3⁻¹` would be
# rounded twice (3⁻¹ first), and is one unit in the last place off for a third of these values.
# Each is checked against numpy:

# %% id="tensors-16"
xs = x.numpy()
samples = np.random.default_rng(1).standard_normal(10_000).astype(np.float32)
exact = samples / np.float32(3)
assert np.array_equal((Tensor(samples) / 3).numpy(), exact)            # rounded once
assert np.mean(samples * (np.float32(1) / np.float32(3)) != exact) > 0.3  # rounded twice
assert np.allclose(x.exp().numpy(), np.exp(xs))
assert np.allclose(x.sigmoid().numpy(), 1 / (1 + np.exp(-xs)))
assert np.allclose(x.cos().numpy(), np.cos(xs), atol=1e-6)
assert np.allclose(x.softmax().numpy(), np.exp(xs) / np.exp(xs).sum())
m = rng.standard_normal((3, 4)).astype(np.float32)
assert np.allclose((x @ Tensor(m)).numpy(), xs @ m, atol=1e-6)

# %% [markdown] id="tensors-17"
# ## Broadcasting
#
# Binary ops follow numpy's rule: align shapes from the right; an axis of size 1 stretches.
# The Tensor layer turns the stretch into an explicit `EXPAND` (a view, no copy — chapter 4),
# so the `ADD` node below sees two operands of the same shape.

# %% id="tensors-18"
column = Tensor([[1.0], [2.0], [3.0]])   # (3, 1)
row = Tensor([[10.0, 20.0, 30.0, 40.0]])  # (1, 4)
table = column + row
print(table.shape)
print(table.uop)
assert np.array_equal(table.numpy(), column.numpy() + row.numpy())

# %% [markdown] id="tensors-19"
# Shapes that do not line up are rejected before any graph is built, with both shapes named:

# %% id="tensors-20"
try:
    Tensor.ones(3, 2) + Tensor.ones(4)
except ValueError as error:
    print("ValueError:", error)

# %% [markdown] id="tensors-21"
# ## Dtypes and promotion
#
# A dtype is a name, a size and a kind ([`dtype.py`](../tinyteach/dtype.py)). When two dtypes
# meet, the result takes their *least upper bound* in tinygrad's promotion lattice:
# `bool < int8 < int16 < int32 < int64 < float16 < float32 < float64`, with the unsigned types
# beside their signed neighbours.

# %% id="tensors-22"
from tinyteach.dtype import least_upper_dtype

pairs = [(dtypes.int8, dtypes.uint8), (dtypes.int32, dtypes.uint32), (dtypes.bool, dtypes.int32),
         (dtypes.int32, dtypes.float16), (dtypes.float16, dtypes.float32)]
for left, right in pairs:
    print(f"{left.name:>8} + {right.name:<8} -> {least_upper_dtype(left, right).name}")

# %% [markdown] id="tensors-23"
# One difference from numpy is worth remembering: numpy promotes `int32 + float16` to
# `float64` (to hold every int32 exactly); tinygrad and tinyteach pick `float16` — any float
# beats any int, and the result stays as small as possible.
#
# A Python scalar does not have a fixed dtype: it adapts to the tensor it meets. `int * 2`
# stays int, `int * 0.5` becomes the default float, and `/` is always true division.

# %% id="tensors-24"
ints = Tensor([1, 2, 3])
print(ints.dtype, (ints * 2).dtype, (ints * 0.5).dtype, (ints / 2).dtype)
assert (ints / 2).tolist() == [0.5, 1.0, 1.5]
assert np.array_equal((Tensor([7, -7]) // 2).numpy(), np.array([7, -7]) // 2)  # floors, as numpy

# %% [markdown] id="tensors-42"
# ### bfloat16: the top half of a float32
#
# `bfloat16` keeps a float32's sign and all 8 bits of its exponent (so the same range, up to
# about 3.4e38) and only 7 of the 23 mantissa bits: the 16 bits a float32 has on top. (float16
# has 5 exponent bits and 10 mantissa bits: more digits, but nothing above 65504.) It sits
# beside float16 in the lattice: `float16 + bfloat16` gives float32, which holds both.
#
# numpy has no bfloat16, so tinyteach stores each value as its 16-bit word (a uint16 buffer,
# tagged as bfloat16). Coming back to float32 is exact: the word becomes the float's top half.
# Going to bfloat16 drops the low 16 bits and rounds to the nearest word, ties to the even one:
# add 0x7FFF, plus 1 if the lowest kept bit is set, and the carry reaches the kept half exactly
# when it should. Every op on bfloat16 converts its operands to float32, computes there and
# rounds the result back, as PyTorch does (the C and OpenCL kernels call two small conversion
# functions). The cell checks the words and one sum against PyTorch's bfloat16:

# %% id="tensors-43"
import torch

from tinyteach.dtype import to_bfloat16_bits

values = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, 1 / 3, 65504.0, 3e38, -0.0], np.float32)
words = to_bfloat16_bits(values).view(np.uint16)
torch_words = torch.tensor(values).bfloat16().view(torch.int16).numpy().view(np.uint16)
for value, word in zip(values, words):
    top_half = int(np.array(value, np.float32).view(np.uint32)) >> 16
    print(f"{value:>14.8g} -> 0x{word:04X}  (top half 0x{top_half:04X})  "
          f"back: {Tensor([value]).bfloat16().item():.8g}")
assert np.array_equal(words, torch_words)
print(least_upper_dtype(dtypes.float16, dtypes.bfloat16), least_upper_dtype(dtypes.int32,
                                                                           dtypes.bfloat16))
ours = (Tensor(values[:4]).bfloat16() * 3 + 1).numpy()
assert np.array_equal(ours, (torch.tensor(values[:4]).bfloat16() * 3 + 1).float().numpy())

# %% [markdown] id="tensors-25"
# ## Indexing is movement
#
# `t[...]` is written in [`tensor/indexing.py`](../tinyteach/tensor/indexing.py) with the six movement ops:
# an int is a `SHRINK` to one element and a `RESHAPE` that drops the axis; a slice is a
# `SHRINK`; a step of 2 pads, reshapes into pairs and keeps the first of each pair; a negative
# step is a `FLIP`; `None` is a `RESHAPE` that adds an axis. Nothing is copied.

# %% id="tensors-26"
t_np = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
t = Tensor(t_np)
for index in [(1, slice(None, None, 2), None, -1), (slice(None), slice(None, None, -1)),
              (Ellipsis, 1)]:
    view = t[index]
    print(f"{str(index):>48} -> shape {view.shape}, ops {ops_used(view)}")
    assert np.array_equal(view.numpy(), t_np[index])

# %% [markdown] id="tensors-27"
# Indexing with an integer *tensor* ("advanced indexing") cannot be a view: it selects
# arbitrary rows. tinyteach builds it without a gather op: each index becomes a one-hot mask
# (`index == arange(n)`, a comparison), and a sum over the axis picks the element. It costs `n`
# times more arithmetic than a real gather, but needs no new primitive.

# %% id="tensors-28"
picked = t[:, Tensor([2, 0])]
print(picked.shape, ops_used(picked))
assert np.array_equal(picked.numpy(), t_np[:, [2, 0]])

# %% [markdown] id="tensors-29"
# ## Random numbers from a counter-based cipher
#
# There is no random-number op either. `Tensor.rand`
# ([`tensor/create.py`](../tinyteach/tensor/create.py)) is tinygrad's generator, bit for bit:
# **threefry-2x32**, a small block cipher made of 32-bit additions, xors and rotations
# (Salmon et al., 2011). It is *counter-based*: encrypting the numbers 0, 1, 2, ... under a key
# gives bits that look random, and number `n` depends only on (key, n), not on the numbers
# before it — so every element is computed on its own, in parallel, by an ordinary kernel. It
# is integer arithmetic (`ADD`, `XOR`, a rotation as `MUL` and `IDIV` by powers of two), so every
# device gives exactly the same bits.
#
# The layout is tinygrad's. Each device holds a key `[low 32 bits of sha256(its place), seed]`
# (the first device drawn from after `manual_seed` has place 0) and a 64-bit counter `c`, both
# in small buffers on the device. A draw of `n` 32-bit words takes the counter and advances it
# by `n`: the draw's own key is threefry of `c` under the device's key, and its words are
# threefry of the pairs `(j, j + n/2)`, `j = 0 .. n/2 − 1`, under that key — first every first
# word, then every second.

# %% id="tensors-30"
Tensor.manual_seed(42)
first = Tensor.rand(5).numpy()
Tensor.manual_seed(42)
again = Tensor.rand(5).numpy()
assert np.array_equal(first, again)     # same seed, same numbers
print(first)
print(ops_used(Tensor.rand(5)))


# %% [markdown] id="tensors-31"
# The same computation in numpy, written from the description above, reproduces the bits
# exactly. Bits become floats without any arithmetic: 23 random bits placed under the exponent
# of 1.0 (`0x3F800000`) are a float in [1, 2); subtracting 1, which is exact, gives [0, 1).
# tinygrad 0.14 prints `[0.5334206819534302, 0.6701551675796509, 0.7630789279937744]` for
# `Tensor.manual_seed(42); Tensor.rand(3).tolist()`: the same numbers. (They are not the first
# three of `rand(5)` above: where a draw's words split in halves depends on its size.)

# %% id="tensors-32"
import hashlib

ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))     # bits rotated in rounds 1-4, then 5-8

def threefry2x32(x0, x1, key0, key1):
    x0, x1, key0, key1 = (np.array(v, dtype=np.uint32, ndmin=1) for v in (x0, x1, key0, key1))
    schedule = (key1, key0 ^ key1 ^ np.uint32(0x1BD11BDA), key0)    # arrays wrap silently
    x0, x1 = x0 + schedule[2], x1 + schedule[0]
    for block in range(5):                  # 5 blocks of 4 rounds; a key word after each
        for r in ROTATIONS[block % 2]:
            x0 = x0 + x1
            x1 = ((x1 << np.uint32(r)) | (x1 >> np.uint32(32 - r))) ^ x0
        x0 = x0 + schedule[block % 3]
        x1 = x1 + schedule[(block + 1) % 3] + np.uint32(block + 1)
    return x0, x1

def numpy_rand(seed: int, count: int, start: int = 0, place: int = 0) -> np.ndarray:
    digest = hashlib.sha256(place.to_bytes(4, "big")).digest()
    device_key = (int.from_bytes(digest, "big") & 0xFFFFFFFF, seed)
    draw_key = threefry2x32(start & 0xFFFFFFFF, start >> 32, *device_key)   # the counter's
    half = -(-count // 2)
    j = np.arange(half, dtype=np.uint32)
    words = np.concatenate(threefry2x32(j, j + np.uint32(half), *draw_key))[:count]
    return ((words >> np.uint32(9)) | np.uint32(0x3F800000)).view(np.float32) - 1

assert np.array_equal(numpy_rand(42, 5), first)
assert numpy_rand(42, 3).tolist() == [0.5334206819534302, 0.6701551675796509,
                                      0.7630789279937744]       # tinygrad 0.14's numbers

# %% [markdown] id="tensors-33"
# `randn` turns two uniforms into a normal with the Box–Muller transform
# (`√(−2 ln(1−u₁)) · cos(2π u₂)`). A quick statistical check:

# %% id="tensors-34"
Tensor.manual_seed(0)
normal = Tensor.randn(20_000).numpy()
print(f"mean {normal.mean():+.3f}, std {normal.std():.3f}")
assert abs(normal.mean()) < 0.03 and abs(normal.std() - 1) < 0.03


# %% [markdown] id="tensors-35"
# ## Try it
#
# 1. Write `softsign(x) = x / (1 + |x|)` with Tensor ops, check it against numpy, and list
#    the primitive ops its graph uses.
# 2. Without `[...]`, select every other column of a `(3, 6)` tensor using only `reshape`
#    and `shrink`. Check against `t_np[:, ::2]`.
# 3. Is `Tensor.rand(3)` followed by `Tensor.rand(5)` the same eight numbers as one
#    `Tensor.rand(8)`? Predict it from the layout above, then check it, and reproduce the
#    second draw with `numpy_rand` (its `start` is the counter's value).

# %% [markdown] id="tensors-36"
# #### Solution (click to show): exercise 1

# %% id="tensors-37" jupyter={"source_hidden": true}
def softsign(x: Tensor) -> Tensor:
    return x / (1 + x.abs())

values = np.linspace(-3, 3, 7, dtype=np.float32)
assert np.allclose(softsign(Tensor(values)).numpy(), values / (1 + np.abs(values)))
ops_used(softsign(Tensor(values)))

# %% [markdown] id="tensors-38"
# #### Solution (click to show): exercise 2

# %% id="tensors-39" jupyter={"source_hidden": true}
grid_np = np.arange(18, dtype=np.float32).reshape(3, 6)
grid = Tensor(grid_np)
pairs = grid.reshape(3, 3, 2)                          # columns in pairs: (0,1), (2,3), (4,5)
every_other = pairs.shrink(((0, 3), (0, 3), (0, 1))).reshape(3, 3)   # keep the first of each
assert np.array_equal(every_other.numpy(), grid_np[:, ::2])
every_other.numpy()


# %% [markdown] id="tensors-40"
# #### Solution (click to show): exercise 3

# %% id="tensors-41" jupyter={"source_hidden": true}
# No: each draw takes its own key, threefry of the counter (0 for the first draw, 3 for the
# second), and splits its words in halves of its own size; the counter only says where the
# next draw starts. Counter-based: the second draw needs no numbers of the first.
Tensor.manual_seed(7)
three, five = Tensor.rand(3).numpy(), Tensor.rand(5).numpy()
Tensor.manual_seed(7)
eight = Tensor.rand(8).numpy()
print(np.concatenate([three, five]), eight, sep="\n")
assert not np.array_equal(np.concatenate([three, five]), eight)
assert np.array_equal(five, numpy_rand(7, 5, start=3))
assert np.array_equal(eight, numpy_rand(7, 8))
