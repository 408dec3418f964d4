# %% [markdown] id="gpt-01"
# # Chapter 11b — Attention and a small GPT
#
# The capstone: a character-level GPT, built from the layers of chapter 11 and trained on
# tinyteach. On the way we look at it the way the compiler does:
#
# - **tokens and embeddings**: text becomes integers, integers become rows of a matrix;
# - **attention** written out from primitive ops, then as `scaled_dot_product_attention`, with
#   the kernels each becomes and the reason for every cut: what fuses, and what cannot (the
#   softmax's two reductions between the two matrix products);
# - a **KV cache** for generation over a **symbolic length**: the position is a `Variable`,
#   so one compiled kernel and one TinyJit capture serve every length;
# - a **training run** that beats a bigram model on text it never saw, and a few sampled lines.
#
# Module: [`tinyteach/nn/transformer.py`](../tinyteach/nn/transformer.py). The full-size
# script (about 0.8M parameters, checkpoints, a progress bar) is
# [`examples/gpt.py`](../examples/gpt.py); its measurements against PyTorch are
# [`benchmarks/gpt.py`](../benchmarks/gpt.py).

# %% id="gpt-02"
# %load_ext tinyteach
import math

import numpy as np

import viz
from tinyteach import Device, GlobalCounters, Tensor, TinyJit, nn
from tinyteach.nn.state import get_parameters
from tinyteach.nn.transformer import (
    GPT,
    CharTokenizer,
    GPTConfig,
    Sampler,
    clip_grad_norm_,
    cosine_lr,
    stdlib_docstrings,
)
from tinyteach.schedule import create_schedule

Device.DEFAULT = "CPU"   # every chapter runs on the CPU device: generated C, compiled here
Tensor.manual_seed(0)
rng = np.random.default_rng(0)


def schedule_of(*tensors):
    """The kernels realizing `tensors` would run (nothing runs)."""
    items, _ = create_schedule([t.uop for t in tensors], "CPU")
    return items


# %% [markdown] id="gpt-03"
# ## Tokens
#
# A language model predicts the next token from the ones before it. Our tokens are characters:
# `CharTokenizer.printable()` numbers newline, space and the 94 visible ASCII characters,
# 96 tokens in all; anything else reads as `?`.
#
# The text must be on every machine without a download, so it is the docstrings of Python's
# own standard library: `stdlib_docstrings` reads the source files of a fixed, sorted list of
# modules with `ast` (nothing is imported) and joins their docstrings. The example uses 66
# modules; this chapter takes eight, to stay quick. The last tenth is held out: the model never
# trains on it, and its loss there says whether it learned the language or the training text.

# %% id="gpt-04"
tokenizer = CharTokenizer.printable()
modules = ("abc", "argparse", "dataclasses", "functools", "pathlib", "shutil", "textwrap",
           "typing")
text = stdlib_docstrings(modules)
data = np.array(tokenizer.encode(text), dtype=np.int32)
print(f"{tokenizer.vocab_size} tokens;", repr(text[:60]))
print("encoded:", data[:12])
assert tokenizer.decode(data[:60]) == text[:60]
assert len(data) > 50_000
split = len(data) * 9 // 10
train_data, held_out = data[:split], data[split:]
print(f"{len(train_data):,} characters to train on, {len(held_out):,} held out")

# %% [markdown] id="gpt-05"
# ## Embeddings
#
# `nn.Embedding(96, C)` holds a weight of shape (96, C); token `t` becomes row `t`. tinyteach
# has no gather kernel for it: the lookup is a one-hot matrix times the weight,
# `(idx[..., None] == arange(96)) @ weight`, so its gradient is an ordinary matrix product
# too. A GPT adds a second embedding for the position, 0 … block_size − 1: attention itself does
# not know where a token is.

# %% id="gpt-06"
embedding = nn.Embedding(tokenizer.vocab_size, 8)
idx = Tensor(data[:5])
np.testing.assert_allclose(embedding(idx).numpy(), embedding.weight.numpy()[data[:5]])
print("tokens", idx.shape, "->", embedding(idx).shape)
lookup_items = schedule_of(embedding(idx))
print("kernels:", [item.name for item in lookup_items])
print(f"{lookup_items[0].name} is stored because {lookup_items[0].boundary_reason}")
np.testing.assert_array_equal(Tensor.arange(96).numpy(), np.arange(96))  # 10*i + j, cut to 96
assert lookup_items[0].name == "r_10_10" and "another reduction" in lookup_items[0].boundary_reason

# %% [markdown] id="gpt-07"
# Two kernels, and the first is where `arange(96)` comes from (chapter 11's "arange in every
# step"). An arange is a running sum of ones, and one of 96 would add up to 96 ones per element;
# so a long arange is built from a short one (`_arange_int` in `tinyteach/tensor_create.py`):
# `10·i + j` over a 10×10 grid of `i` and `j` from `arange(10)`, flattened and cut to its first
# 96. `r_10_10` is that `arange(10)`: 10 running sums of up to 10 ones, stored because it feeds
# the second kernel's sum. The second kernel makes `10·i + j` from it, compares with the
# tokens, multiplies and sums in one go — the one-hot matrix never exists in memory.
#
# ## Attention, from primitives
#
# Each position `i` has a query `q_i`, a key `k_i` and a value `v_i` (vectors of size d, made by
# a Linear from the embedding). Position `i` looks at positions `j ≤ i` (causal: the future is
# hidden), weighs each by how well its key matches the query, and averages their values:
#
# $$\text{out}_i = \sum_{j \le i} \operatorname{softmax}_j\!\Big(\frac{q_i \cdot k_j}{\sqrt d}\Big)\, v_j$$
#
# Written with nothing but Tensor ops — two matrix products and a softmax between them, with
# the max subtracted first so `exp` cannot overflow:

# %% id="gpt-08"
def attention(q, k, v):
    """Causal attention over the last two axes: (..., T, d) each -> (..., T, d)."""
    length, d = q.shape[-2], q.shape[-1]
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)              # (..., T, T)
    causal = Tensor.ones(length, length, dtype="bool").tril()    # j <= i
    scores = causal.where(scores, -math.inf)
    shifted = scores - scores.max(-1, keepdim=True)
    weights = shifted.exp() / shifted.exp().sum(-1, keepdim=True)
    return weights @ v


def random_tensor(*shape):
    return Tensor(rng.standard_normal(shape).astype(np.float32)).realize()


B, H, T, D = 1, 2, 8, 4          # batch, heads, positions, head size
q, k, v = random_tensor(B, H, T, D), random_tensor(B, H, T, D), random_tensor(B, H, T, D)


def numpy_attention(q, k, v):
    scores = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])
    scores = np.where(np.tril(np.ones((q.shape[-2],) * 2, bool)), scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    return weights / weights.sum(-1, keepdims=True) @ v


expected = numpy_attention(q.numpy(), k.numpy(), v.numpy())
np.testing.assert_allclose(attention(q, k, v).numpy(), expected, rtol=1e-5, atol=1e-6)
primitive_items = schedule_of(attention(q, k, v))
for number, item in enumerate(primitive_items, 1):
    print(f"kernel {number}: {item.name:10} stored because {item.boundary_reason}")
assert len(primitive_items) == 5

# %% [markdown] id="gpt-09"
# Five kernels for one attention. In the drawing, each arrow is labelled with why its value had
# to go through memory:

# %% id="gpt-10"
viz.schedule(attention(q, k, v))

# %% [markdown] id="gpt-11"
# Reading them in order:
#
# 1. `r_8_8` is the `arange(8)` that the causal mask's `tril` compares against (a running sum
#    of ones, 8 integers). It stores the arange, not the mask: the comparison `j ≤ i` is fused
#    into each of the three kernels that read it, and those three readers are why it is stored.
# 2. `r_2_8_8_4` is the first matrix product, the scores `q k^T`: one sum over d per (head, i,
#    j); its one fused MUL is the products q·k. The scale is not in it: it stores the raw
#    products, and each of the three kernels that read them multiplies by `1/√d` again.
# 3. `r_2_8_8` is the softmax's **max** over j, with the scale and the mask fused into its input.
# 4. `r_2_8_8` is the softmax's **sum** of `exp(s - max)` over j.
# 5. `r_2_8_4_8` is the second matrix product. Its input is `exp(s - max) / sum` — the
#    softmax's elementwise work (scale, mask, subtract, exp, divide) is fused into it and never
#    stored.
#
# The generated C says the same: `r_8_8` writes integers, and the scale, `* 0.5f` for d = 4,
# appears in the last three kernels and not in the product that computes the scores:

# %% id="gpt-26"
from tinyteach.lower import lower

cpu = Device["CPU"].renderer
sources = [cpu.render(item.name, lower(item.ast, vector_width=cpu.vector_width))
           for item in primitive_items]
scale = f"*{1 / math.sqrt(D)}f"                    # / sqrt(d): a multiplication by 0.5
scaled = [item.name for item, source in zip(primitive_items, sources) if scale in source]
print(f"{primitive_items[0].name} writes", sources[0].split("(", 1)[1].split(")")[0])
print(f"kernels with {scale}:", scaled)
assert "void r_8_8(int* restrict data0)" in sources[0]     # the arange: 8 integers
assert [scale in source for source in sources] == [False, False, True, True, True]

# %% [markdown] id="gpt-27"
# `Tensor.scaled_dot_product_attention(k, v, is_causal=True)` (in `tinyteach/tensor_nn.py`) is
# the same computation — it builds the mask with `tril` and calls `softmax` — and it becomes the
# same kernels:

# %% id="gpt-12"
library = q.scaled_dot_product_attention(k, v, is_causal=True)
np.testing.assert_allclose(library.numpy(), expected, rtol=1e-5, atol=1e-6)
library_items = schedule_of(q.scaled_dot_product_attention(k, v, is_causal=True))
print([item.name for item in library_items])
assert [item.name for item in library_items] == [item.name for item in primitive_items]
assert [item.boundary_reason for item in library_items] == [
    item.boundary_reason for item in primitive_items]
viz.schedule(q.scaled_dot_product_attention(k, v, is_causal=True))

# %% [markdown] id="gpt-13"
# ## What fuses, and what cannot
#
# Everything elementwise fused, into the kernels that read it: the scale and the mask into the
# max, the sum and the second product (each of them computes `s * 0.5` and the comparison
# again), `exp` into the sum and the second product, the division into the second product.
# Nothing elementwise was stored. What stops fusion are the softmax's
# two **reductions**. The max over j must be complete before any `exp(s - max)` can be
# computed, and the sum must be complete before anything is divided by it. Chapter 6's row
# fusion keeps such a chain in one kernel — a softmax on its own is one kernel — but only when
# each reduction is read by that one kernel and the chain stays on the same rows. Here neither
# holds, with the reasons printed above: the max is read by two later kernels (the sum and the
# second product), and the sum feeds a reduction that is not over its rows alone (the second
# product sums over j once for each of the d outputs). And the scores themselves are read by
# three kernels, so they go through memory: a (T, T) matrix per head.

# %% id="gpt-14"
scores_item = primitive_items[1]
print(f"the scores: {scores_item.output.size} floats = B*H*T*T = {B * H * T * T}")
assert scores_item.output.size == B * H * T * T
for length in (8, 64, 1024):
    print(f"T = {length:4}: scores take {B * H * length * length * 4:>10,} bytes per layer")

# %% [markdown] id="gpt-15"
# That (T, T) matrix is why **flash attention** exists. It walks the keys in blocks and keeps,
# per query, a running max `m`, a running sum `l` and a running output; when a block raises the
# max, it rescales what it has so far by `exp(m_old - m_new)`. Then the max, the sum and both
# products happen in one kernel, and the scores never reach memory. This is the *same math
# reordered* — an online softmax — and finding it takes a rewrite that this scheduler does not
# have: it fuses elementwise work into reductions, and a chain of reductions over the same rows,
# but it never turns the max and the sum into running values that a matrix product can carry
# along. (A hand-written kernel, or a compiler that knows the online-softmax identity, does.)
#
# ## The GPT
#
# `GPT` in `transformer.py` is embeddings, `layers` blocks, a last LayerNorm and the head:
#
# ```
# x = token_embedding(tokens) + position_embedding(arange(T))
# for each block:  x = x + attention(norm1(x));  x = x + mlp(norm2(x))   # mlp: C -> 4C -> C, GELU
# logits = norm(x) @ token_embedding.weight.T                             # the head is tied
# ```
#
# One `Linear(C, 3C)` makes q, k and v for every head at once; the heads are a reshape, not a
# loop. The head reuses the token embedding's weight (*weight tying*): the same matrix reads a
# token in and scores it on the way out. Weights start as GPT-2's, normal with std 0.02, so
# the first logits are almost zero and the first loss is almost ln 96.

# %% id="gpt-16"
config = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=32, embed_size=48, layers=1,
                   heads=2)
model = GPT(config)
print(f"{model.parameter_count():,} parameters:")
for name, tensor in list(nn.state.get_state_dict(model).items())[:8]:
    print(f"  {name:28} {tensor.shape}")
assert model.token_embedding.weight.shape == (96, 48)
tokens = Tensor(data[None, :32])
forward_items = schedule_of(model(tokens))
print(f"a forward pass of one block: {len(forward_items)} kernels")

# %% [markdown] id="gpt-17"
# ## Generating with a KV cache
#
# To generate, the model predicts a token, appends it, and predicts again. Recomputing the
# whole prefix every time repeats all the work for the old positions; but a position's key and
# value never change once computed (position i only sees j ≤ i). So each layer keeps a
# **KV cache** of the keys and values so far, and one step only computes the new token's
# q, k, v and attends to the cache.
#
# The cache's length grows every step — and a TinyJit capture (chapter 10) replays the kernels
# of one call. tinygrad's answer, and tinyteach's, is a **symbolic shape**: the position is a
# `Variable("start_pos", 0, block_size - 1)`, bound to the current position at each call
# (`start_pos.bind(p)`). A size may be an expression of it, and a kernel over such a size is
# compiled for the variable, not for a value: the length becomes an `int start_pos` parameter,
# passed at each launch. In `KVCache`:
#
# - the cache is preallocated at the maximum length: (batch, heads, block_size, head size);
#   a buffer of a symbolic size is always sized for the variable's largest value;
# - the new key is written at slot `start_pos` with
#   `keys.assign(where(arange(block_size) == start_pos, k, keys))`;
# - attention covers `keys[:, :, :start_pos+1]` — a shrink whose end is symbolic, so the
#   scores have shape (1, heads, 1, start_pos+1): no mask, and no slot past the position.
#
# The step's graph is the same for every position but for the value of `start_pos`, so the JIT
# captures once and replays with the new value. We check that it gives the same logits as the
# full forward pass at every position:

# %% id="gpt-18"
prefix = data[:10].tolist()
full = model(Tensor([prefix])).numpy()[0]
sampler = Sampler(model)
start = GlobalCounters.kernel_count
for position, token in enumerate(prefix):
    np.testing.assert_allclose(sampler.logits(token, position), full[position], rtol=1e-4,
                               atol=1e-5)
per_token = len(sampler.jitted_step.captured.launches)
print(f"{len(prefix)} positions, 1 capture, {per_token} kernels per token")
assert sampler.jitted_step.calls == len(prefix)
assert GlobalCounters.kernel_count - start >= per_token * (len(prefix) - 2)

# %% [markdown] id="gpt-19"
# The kernels the JIT replays say it in their names: with 2 heads of size 24, the scores are
# `r_2_start_pos1_24` (for each head and each of the start_pos+1 slots, a sum over 24) and the
# product with the values is `r_2_24_start_pos1` (a sum over the start_pos+1 slots). One
# source serves every position; the length is its last parameter and a loop bound:

# %% id="gpt-20"
launches = sampler.jitted_step.captured.launches
names = [launch.item.name for launch in launches]
head_size = config.embed_size // config.heads
assert f"r_{config.heads}_start_pos1_{head_size}" in names    # the scores
assert f"r_{config.heads}_{head_size}_start_pos1" in names    # weights @ values
scores = next(launch for launch in launches if launch.item.name.startswith("r_2_start_pos1"))
print(scores.runner.source)
assert "const int start_pos" in scores.runner.source
assert "< (start_pos+1);" in scores.runner.source
assert sampler.jitted_step.captured.symbolic
assert scores.var_vals == {"start_pos": len(prefix) - 1}   # the value of the last replay

# %% [markdown] id="gpt-21"
# At position 3 the scores loop runs over 4 slots, at position 31 over 32: the work grows with
# the text, as it should, and nothing is compiled again. (The cache write, `E_2_32_24`, still
# passes over all 32 slots: an assign in tinyteach writes a whole buffer. tinygrad assigns into
# the view `cache[:, :, start_pos:start_pos+1]` instead.) Where the position was an input
# Tensor instead of a Variable, every step would attend over all 32 slots and mask the tail
# away: half of the work wasted, on average — little for a 32-token context, a lot for a long
# one.
#
# ## Training until it beats a bigram model
#
# First a yardstick. A **bigram** model predicts the next character from the current one alone:
# count, in the training text, how often each character follows each other one (starting every
# count at 1, so nothing has probability 0), and normalize each row. Its loss on the held-out
# text, the mean of −ln p(next | current), is what a model that looks at one character gets.
# A GPT sees up to 32; it has to do better than this to have learned anything about words.

# %% id="gpt-28"
counts = np.ones((tokenizer.vocab_size, tokenizer.vocab_size))
np.add.at(counts, (train_data[:-1], train_data[1:]), 1)
bigram = counts / counts.sum(axis=1, keepdims=True)
bigram_loss = -np.log(bigram[held_out[:-1], held_out[1:]]).mean()
unigram = np.bincount(train_data, minlength=tokenizer.vocab_size) + 1.0
unigram_loss = -np.log((unigram / unigram.sum())[held_out]).mean()
print(f"unigram baseline: {unigram_loss:.2f} nats (letter frequencies alone)")
print(f"bigram baseline: {bigram_loss:.2f} nats")

# %% [markdown] id="gpt-29"
# A training step is the loss, `backward()`, `clip_grad_norm_` (scale all gradients together so
# their norm is at most 1) and AdamW, under one TinyJit, exactly as in `examples/gpt.py`. The
# learning rate follows `cosine_lr` (a short warmup, then a cosine); it lives in the optimizer's
# `lr` buffer, which we overwrite before each step, so the replays read the new value. Each
# batch is 64 random windows of 32 characters of the training text; the target is the window
# moved by one. After 400 steps the **validation loss** is the model's mean loss over the
# held-out text, cut into windows of 32.

# %% id="gpt-22"
optimizer = nn.optim.AdamW(get_parameters(model), lr=2e-2, b2=0.99, weight_decay=0.1)


@TinyJit
def train_step(inputs, targets):
    with Tensor.train():
        optimizer.zero_grad()
        loss = model.loss(inputs, targets).backward()
        norm = clip_grad_norm_(optimizer.params, 1.0)
        Tensor.realize(loss, norm, *optimizer.schedule_step())   # read before the update
    return loss


def windows(text, starts, length):
    """Inputs and targets: the windows of `length` at `starts`, and the same moved by one."""
    return (np.stack([text[s:s + length] for s in starts]),
            np.stack([text[s + 1:s + length + 1] for s in starts]))


def random_batch(batch, length):
    return windows(train_data, rng.integers(0, len(train_data) - length - 1, batch), length)


steps, losses = 400, []
for step in range(steps):
    optimizer.lr.assign(Tensor(cosine_lr(step, 2e-2, steps, warmup_steps=10,
                                         min_lr=2e-3))).realize()
    inputs, targets = random_batch(64, config.block_size)
    losses.append(train_step(Tensor(inputs), Tensor(targets)).item())
print(f"{len(train_step.captured.launches)} kernels per training step")
print(f"first loss within 0.05 of ln 96 = {math.log(96):.2f}:",
      abs(losses[0] - math.log(96)) < 0.05)
for first in range(0, steps, 100):
    mean = np.mean(losses[first:first + 100])
    print(f"steps {first:3}-{first + 99}: mean training loss {mean:.2f}")
inputs, targets = windows(held_out, range(0, len(held_out) - config.block_size - 1,
                                          config.block_size), config.block_size)
validation_loss = model.loss(Tensor(inputs), Tensor(targets)).item()
print(f"validation loss: {validation_loss:.2f} nats (bigram baseline: {bigram_loss:.2f})")
assert abs(losses[0] - math.log(96)) < 0.05
assert validation_loss < bigram_loss

# %% [markdown] id="gpt-23"
# On text it never saw, the 35k-parameter model now does better than a model of which character
# follows which: it has learned something from the characters further back, short words and
# where spaces go. (`examples/gpt.py`'s 0.8M parameters, trained for minutes, go much further.)
# A few lines sampled with temperature 0.8 and top-k 10 (the sampling
# itself runs on the host in numpy, `sample_token`); the text depends on the Python version
# whose docstrings were read, so this output is not compared:

# %% id="gpt-24"
# NBVAL_IGNORE_OUTPUT
new_tokens = Sampler(model).generate(tokenizer.encode("Return the "), 160, temperature=0.8,
                                     top_k=10, seed=0)
sample = "Return the " + tokenizer.decode(new_tokens)
print(sample)
letters_and_spaces = sum(c.isalpha() or c.isspace() for c in sample) / len(sample)
assert letters_and_spaces > 0.8

# %% [markdown] id="gpt-25"
# `python examples/gpt.py` trains the 0.8M-parameter model (4 blocks of width 128, context 64)
# for a few minutes and samples 300 characters; `--steps`, `--device`, `--load` and the
# sampling options are its arguments. `python benchmarks/gpt.py` times a training step and a
# generation step against PyTorch.
#
# **Try it.** Replace `attention` in `gpt-08` by a version without the max subtraction
# (`scores.exp() / scores.exp().sum(...)`). How many kernels does it become, and which reason
# disappears? Then feed it scores of 100 and see why the max is there.
