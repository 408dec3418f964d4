# %% [markdown] id="gpt-01"
# # Chapter 11b — Attention and a small GPT
#
# The capstone: a character-level GPT, built in this notebook from the layers of chapter 11
# (`nn.Linear`, `nn.Embedding`, `nn.LayerNorm`) and trained on tinyteach. On the way we look at
# it the way the compiler does:
#
# - **a yardstick**: the loss of a bigram model (which character follows which) on text the
#   models never train on;
# - **attention** written out from primitive ops, then as `scaled_dot_product_attention`, with
#   the kernels each becomes and the reason for every cut: what fuses, and what cannot (the
#   softmax's two reductions between the two matrix products);
# - **flash attention's online softmax**: the same attention over blocks of keys with a running
#   max and a running sum, first as Tensor code (and what tinyteach's scheduler makes of it),
#   then as the one kernel a scheduler would have to produce, written in C and run on the CPU
#   device;
# - **the GPT, one piece at a time**: one attention head, several heads, an MLP, residual
#   connections, LayerNorm. Each step trains for the same 300 steps and prints its loss on the
#   held-out text, so each piece shows what it pays; the last model, two blocks trained
#   longer, beats the bigram model clearly and writes words;
# - a **KV cache** for generation over a **symbolic length**: the position is a `Variable`,
#   so one compiled kernel and one TinyJit capture serve every length.
#
# Module: [`tinyteach/nn/transformer.py`](../tinyteach/nn/transformer.py), the same GPT as a
# library. The full-size script (about 0.8M parameters, checkpoints, a progress bar) is
# [`examples/gpt.py`](../examples/gpt.py); its measurements against PyTorch are
# [`benchmarks/gpt.py`](../benchmarks/gpt.py).

# %% id="gpt-02"
# %load_ext tinyteach
import math

import numpy as np

import viz
from tinyteach import Device, GlobalCounters, Tensor, TinyJit, nn
from tinyteach.device import Buffer
from tinyteach.dtype import dtypes
from tinyteach.engine.schedule import create_schedule
from tinyteach.nn.state import get_parameters
from tinyteach.nn.transformer import (
    GPT,
    CharTokenizer,
    GPTConfig,
    Sampler,
    clip_grad_norm_,
    cosine_lr,
    sample_token,
    stdlib_docstrings,
)

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

# %% [markdown] id="gpt-21"
# ## The yardstick: a bigram model
#
# Before any network, a number to beat. A **bigram** model predicts the next character from
# the current one alone: count, in the training text, how often each character follows each
# other one (starting every count at 1, so nothing has probability 0), and normalize each row.
# Its loss on the held-out text, the mean of −ln p(next | current) in nats, is what a model
# that looks at one character gets. (The unigram model, letter frequencies without any
# context, is printed too.) A GPT sees up to 32 characters; it has to do better than the bigram
# model to have learned anything about words.

# %% id="gpt-28"
counts = np.ones((tokenizer.vocab_size, tokenizer.vocab_size))
np.add.at(counts, (train_data[:-1], train_data[1:]), 1)
bigram = counts / counts.sum(axis=1, keepdims=True)
bigram_loss = -np.log(bigram[held_out[:-1], held_out[1:]]).mean()
unigram = np.bincount(train_data, minlength=tokenizer.vocab_size) + 1.0
unigram_loss = -np.log((unigram / unigram.sum())[held_out]).mean()
print(f"unigram baseline: {unigram_loss:.2f} nats (letter frequencies alone)")
print(f"bigram baseline: {bigram_loss:.2f} nats")
assert bigram_loss < unigram_loss < math.log(tokenizer.vocab_size)

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
# so a long arange is built from a short one (`_arange_int` in `tinyteach/tensor/create.py`):
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
assert len(primitive_items) == 4

# %% [markdown] id="gpt-09"
# Four kernels for one attention. In the drawing, each arrow is labelled with why its value had
# to go through memory:

# %% id="gpt-10"
viz.schedule(attention(q, k, v))

# %% [markdown] id="gpt-11"
# Reading them in order:
#
# 1. `r_2_8_8_4` is the first matrix product, the scores `q k^T`: one sum over d per (head, i,
#    j); its one fused MUL is the products q·k. The scale is not in it: it stores the raw
#    products, and each of the three kernels that read them multiplies by `1/√d` again.
# 2. `r_2_8_8` is the softmax's **max** over j, with the scale and the mask fused into its input.
# 3. `r_2_8_8` is the softmax's **sum** of `exp(s - max)` over j.
# 4. `r_2_8_4_8` is the second matrix product. Its input is `exp(s - max) / sum` — the
#    softmax's elementwise work (scale, mask, subtract, exp, divide) is fused into it and never
#    stored.
#
# The causal mask has no kernel at all. `tril` (in `tinyteach/tensor/movement.py`) builds it
# from movement ops alone: a row of 15 bools, 7 False then 8 True, and its 8 windows of 8
# (chapter 4's views: a pad, then the sliding-window reshape that convolutions use), flipped
# along the columns. Window i holds True from column 7 − i on, so flipped, row i holds True in
# columns 0 … i. A view of a constant is not data in memory: the kernel that reads it computes
# the pad's condition from its loop counters, and chapter 5's symbolic rules fold that index
# (a sum with a negative term, taken modulo the window's length) down to one comparison of the
# row and the column.
#
# The generated C says the same: the scale, `* 0.5f` for d = 4, appears in the last three
# kernels and not in the product that computes the scores, and the kernels that read the mask
# compare two loop counters and hold no `%` (the first line printed is the row minus the column;
# the score is kept where it is not negative):

# %% id="gpt-26"
from tinyteach.codegen.lower import lower
from tinyteach.opt.heuristic import heuristic_plan

cpu = Device["CPU"].renderer
sources = [cpu.render(item.name, lower(item.ast, heuristic_plan(item.ast, cpu.vector_width)))
           for item in primitive_items]
scale = f"*{1 / math.sqrt(D)}f"                    # / sqrt(d): a multiplication by 0.5
scaled = [item.name for item, source in zip(primitive_items, sources) if scale in source]
mask_lines = [line.strip() for line in sources[1].splitlines()
              if "(-(ridx0))" in line or "INFINITY)" in line][:2]
print(f"kernels with {scale}:", scaled)
print(f"{primitive_items[1].name}'s mask, column ridx0 against row:", *mask_lines, sep="\n  ")
assert len(mask_lines) == 2 and "<0" in mask_lines[1]
assert [scale in source for source in sources] == [False, True, True, True]
assert all("%" not in source for source in sources[1:])  # the mask: a comparison, no modulo

# %% [markdown] id="gpt-27"
# `Tensor.scaled_dot_product_attention(k, v, is_causal=True)` (in `tinyteach/tensor/nn.py`) is
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
scores_item = primitive_items[0]
print(f"the scores: {scores_item.output.size} floats = B*H*T*T = {B * H * T * T}")
assert scores_item.output.size == B * H * T * T
for length in (8, 64, 1024):
    print(f"T = {length:4}: scores take {B * H * length * length * 4:>10,} bytes per layer")

# %% [markdown] id="gpt-15"
# ## Flash attention: the online softmax
#
# That (T, T) matrix is why **flash attention** exists. It walks the keys in blocks and keeps,
# per query, a running max `m`, a running sum `l` and a running output `o`. For a block J of
# keys, with scores `s_j`:
#
# $$m' = \max\big(m, \max_{j \in J} s_j\big), \qquad
#   l' = l\, e^{m - m'} + \sum_{j \in J} e^{s_j - m'}, \qquad
#   o' = o\, e^{m - m'} + \sum_{j \in J} e^{s_j - m'}\, v_j$$
#
# and after the last block the output is `o / l`. It is exact, not an approximation: every term
# in `l` and `o` carries the factor `e^{-m}` of the max so far, multiplying by `e^{m - m'}`
# swaps it for the new max's, and at the end the common factor cancels in `o / l`. So the
# softmax is *the same math reordered*: no row of scores is needed whole, a block at a time is
# enough. Written with Tensor ops, block by block (a Python loop over the blocks, so the graph
# holds one copy of the update per block):

# %% id="gpt-30"
def online_softmax_attention(q, k, v, key_block):
    """Causal attention that reads the keys `key_block` at a time, with a running max, sum and
    output per query (flash attention's online softmax)."""
    length, d = q.shape[-2], q.shape[-1]
    query_positions = Tensor.arange(length).reshape(length, 1)
    running_max = Tensor.full((*q.shape[:-1], 1), -math.inf)
    running_sum = Tensor.zeros(*q.shape[:-1], 1)
    output = Tensor.zeros(*q.shape)
    for start in range(0, length, key_block):
        keys, values = k[..., start:start + key_block, :], v[..., start:start + key_block, :]
        scores = q @ keys.transpose(-1, -2) / math.sqrt(d)               # (..., T, key_block)
        key_positions = Tensor.arange(start, start + key_block).reshape(1, key_block)
        scores = (key_positions <= query_positions).where(scores, -math.inf)
        new_max = running_max.maximum(scores.max(-1, keepdim=True))
        correction = (running_max - new_max).exp()                       # e^(m - m')
        weights = (scores - new_max).exp()
        running_sum = running_sum * correction + weights.sum(-1, keepdim=True)
        output = output * correction + weights @ values
        running_max = new_max
    return output / running_sum


for key_block in (1, 2, 4, 8):
    online = online_softmax_attention(q, k, v, key_block).numpy()
    np.testing.assert_allclose(online, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(online, attention(q, k, v).numpy(), rtol=1e-5, atol=1e-6)
print("online softmax == softmax(q k^T / sqrt(d)) v for key blocks of 1, 2, 4 and 8")

# %% [markdown] id="gpt-31"
# The numbers agree for every block size. What does tinyteach's scheduler make of it? With
# T = 8 and blocks of 4 keys:

# %% id="gpt-32"
KEY_BLOCK = 4
online_items = schedule_of(online_softmax_attention(q, k, v, KEY_BLOCK))
for number, item in enumerate(online_items, 1):
    print(f"kernel {number}: {item.name:10} stores {item.output.size:3} values: "
          f"{item.boundary_reason}")
score_blocks = [item for item in online_items[:-1] if item.output.size == B * H * T * KEY_BLOCK]
print(f"{len(score_blocks)} blocks of scores stored: "
      f"{sum(item.output.size for item in score_blocks)} floats = B*H*T*T = {B * H * T * T}")
assert len(score_blocks) == T // KEY_BLOCK
assert sum(item.output.size for item in score_blocks) == B * H * T * T
assert online_items[-1].output.size == B * H * T * D       # the sums and the products: one kernel
viz.schedule(online_softmax_attention(q, k, v, KEY_BLOCK))

# %% [markdown] id="gpt-33"
# Read honestly, this is not flash attention yet. Kernels 1 and 2 are the aranges of the key
# and the query positions (built as `gpt-07` tells; `tril` needs none). Then the scheduler did fuse a lot: the
# running sum and the running output of both blocks, their rescaling by `e^{m - m'}` and the
# final division all landed in the last kernel, so neither `l` nor `o` ever went through
# memory. But each block's scores are a reduction (the product q·k) read by two later kernels,
# the block's max and that last kernel, so they are stored (kernels 3 and 5): block by block,
# the whole (T, T) matrix reaches memory after all. And the running max is a chain of small
# kernels, one per block (4 and 6), because each block's max must be complete before that
# block's `exp(s - m')` can start. What would make it
# one kernel is a reduction over the keys whose accumulator is the triple (m, l, o) with the
# update above as its combine step; tinyteach's reductions accumulate one value with ADD or MAX,
# and its scheduler does not rewrite a softmax into that form.
#
# So here is the kernel a scheduler would have to produce, written by hand in C: per head and
# query, a loop over key blocks; a block's scores live in a small local array (registers, or
# shared memory on a GPU), the running max, sum and output in local variables. It is compiled
# by the CPU device's own Compiler and run as a Program on Buffers, as chapter 9's `dev-45`
# does:

# %% id="gpt-34"
FLASH_SOURCE = """
#include <math.h>

void flash_attention(float* restrict out, const float* restrict q, const float* restrict k,
                     const float* restrict v, const int heads, const int length,
                     const int head_size, const int key_block) {
  const float scale = 1.0f / sqrtf((float)head_size);
  for (int head = 0; head < heads; head++) {
    const int base = head * length * head_size;
    for (int i = 0; i < length; i++) {
      float running_max = -INFINITY, running_sum = 0.0f, acc[64] = {0.0f};
      for (int start = 0; start <= i; start += key_block) {    /* causal: blocks up to i */
        float scores[64];                                      /* one block, kept local */
        int end = start + key_block <= i + 1 ? start + key_block : i + 1;
        float block_max = -INFINITY;
        for (int j = start; j < end; j++) {
          float dot = 0.0f;
          for (int c = 0; c < head_size; c++)
            dot += q[base + i * head_size + c] * k[base + j * head_size + c];
          scores[j - start] = dot * scale;
          block_max = fmaxf(block_max, scores[j - start]);
        }
        float new_max = fmaxf(running_max, block_max);
        float correction = expf(running_max - new_max);        /* e^(m - m') */
        running_sum *= correction;
        for (int c = 0; c < head_size; c++) acc[c] *= correction;
        for (int j = start; j < end; j++) {
          float weight = expf(scores[j - start] - new_max);
          running_sum += weight;
          for (int c = 0; c < head_size; c++) acc[c] += weight * v[base + j * head_size + c];
        }
        running_max = new_max;
      }
      for (int c = 0; c < head_size; c++) out[base + i * head_size + c] = acc[c] / running_sum;
    }
  }
}
"""
flash = Device["CPU"].program("flash_attention", Device["CPU"].compiler.compile(FLASH_SOURCE))


def buffer_of(tensor):
    """A CPU Buffer holding the tensor's values (float32, row-major)."""
    values = tensor.numpy().astype(np.float32).ravel()
    return Buffer("CPU", values.size, dtypes.float32).copyin(values)


result = Buffer("CPU", B * H * T * D, dtypes.float32)
flash(result, buffer_of(q), buffer_of(k), buffer_of(v), vals=(B * H, T, D, KEY_BLOCK))
flash_output = result.numpy().reshape(B, H, T, D)
np.testing.assert_allclose(flash_output, expected, rtol=1e-5, atol=1e-6)
np.testing.assert_allclose(flash_output, attention(q, k, v).numpy(), rtol=1e-5, atol=1e-6)
print(f"one kernel, key blocks of {KEY_BLOCK}: equals softmax(q k^T / sqrt(d)) v;",
      f"it writes {result.size} floats, the output, and nothing else")

# %% [markdown] id="gpt-35"
# One launch, one buffer written, and no (T, T) matrix anywhere: the scores of a block exist
# only inside the loop. (The local arrays are sized 64, so this kernel takes head sizes and key
# blocks up to 64; a real one is generated for its sizes, as tinyteach's kernels are.) Its
# arithmetic is about that of the four kernels of `gpt-08` (which compute each `exp` twice, in
# the sum and in the product; this kernel once, plus one rescaling per block), but its memory
# traffic no longer grows with T × T. On a GPU the same loop
# runs one work-group per block of queries, with the key and value blocks in shared memory
# (chapter 8b); that is FlashAttention.

# %% [markdown] id="gpt-40"
# ## Building the GPT, one piece at a time
#
# Now the model, built up in five steps. Every step is a complete language model with the same
# frame: a token embedding and a position embedding (added, so each position holds what the
# character is and where it is), some layers, and a Linear head that turns each position's
# vector into 96 logits, the scores of the next character. Only the layers change.
#
# Every step trains the same way, so the losses compare: 300 steps of AdamW on batches of 32
# random windows of 32 characters (the same windows for every model), a learning rate of 1e-2
# with a short warmup and a cosine decay (`cosine_lr`), and the gradients clipped to norm 1
# (`clip_grad_norm_`). A training step is the loss, `backward()` and the update under one
# TinyJit (chapter 10): it runs the first call, captures the kernels of the second and replays
# them for the other 298. The learning rate lives in the optimizer's `lr` buffer, overwritten
# before each step, so the replays read the new value. After training, the **validation loss**
# is the model's mean loss over the held-out text, cut into windows of 32.

# %% id="gpt-41"
VOCAB, CONTEXT, WIDTH, HEADS = tokenizer.vocab_size, 32, 64, 4


class LanguageModel:
    """Token and position embeddings, then `layers` in order, then a Linear head to logits."""

    def __init__(self, layers):
        self.token_embedding = nn.Embedding(VOCAB, WIDTH)
        self.position_embedding = nn.Embedding(CONTEXT, WIDTH)
        self.layers = layers
        self.head = nn.Linear(WIDTH, VOCAB)

    def __call__(self, tokens):
        """tokens (B, T) -> logits (B, T, VOCAB): at each position, scores for the next one."""
        positions = Tensor.arange(tokens.shape[-1])
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def cross_entropy(model, inputs, targets):
    """The mean of -ln p(target) over every position of every window."""
    logits = model(inputs).reshape(-1, VOCAB)
    return logits.sparse_categorical_crossentropy(targets.reshape(-1))


def windows(text, starts, length):
    """Inputs and targets: the windows of `length` at `starts`, and the same moved by one."""
    return (np.stack([text[s:s + length] for s in starts]),
            np.stack([text[s + 1:s + length + 1] for s in starts]))


def train(model, steps=300, lr=1e-2, batch=32):
    """AdamW under one TinyJit on random windows of the training text; the training losses."""
    optimizer = nn.optim.AdamW(get_parameters(model), lr=lr, weight_decay=0.01)

    @TinyJit
    def train_step(inputs, targets):
        with Tensor.train():
            optimizer.zero_grad()
            loss = cross_entropy(model, inputs, targets).backward()
            clip_grad_norm_(optimizer.params, 1.0)
            Tensor.realize(loss, *optimizer.schedule_step())
        return loss

    batches = np.random.default_rng(0)        # the same windows for every model
    losses = []
    for step in range(steps):
        rate = cosine_lr(step, lr, steps, warmup_steps=10, min_lr=lr / 10)
        optimizer.lr.assign(Tensor(rate)).realize()
        starts = batches.integers(0, len(train_data) - CONTEXT - 1, batch)
        inputs, targets = windows(train_data, starts, CONTEXT)
        losses.append(train_step(Tensor(inputs), Tensor(targets)).item())
    return losses


validation_windows = windows(held_out, range(0, len(held_out) - CONTEXT - 1, CONTEXT), CONTEXT)


def validation_loss(model):
    inputs, targets = validation_windows
    return cross_entropy(model, Tensor(inputs), Tensor(targets)).item()


results = {"bigram counts": bigram_loss}


def build_and_train(name, make_layers, **training):
    """A LanguageModel over `make_layers()`, trained; prints and records its validation loss."""
    Tensor.manual_seed(0)                     # the same initial weights, step after step
    model = LanguageModel(make_layers())
    losses = train(model, **training)
    results[name] = validation_loss(model)
    parameters = sum(p.numel() for p in get_parameters(model))
    print(f"{name}: {parameters:,} parameters, last 50 steps' training loss "
          f"{np.mean(losses[-50:]):.2f}, validation loss {results[name]:.2f} nats")
    return model

# %% [markdown] id="gpt-42"
# ### Step 1: one attention head
#
# The first layer is one head of attention: three Linear maps make a query, a key and a value
# from each position's vector, and `attention` from `gpt-08` (the one we drew the kernels of)
# mixes the values of positions ≤ i into position i. The head's output replaces the
# embedding, so position i knows its own character only by attending to itself. Still, it is
# the first model here that can see further back than one character:

# %% id="gpt-43"
class Head:
    """One head of causal self-attention: q, k and v are Linear maps of x."""

    def __init__(self, width, head_size):
        self.query = nn.Linear(width, head_size, bias=False)
        self.key = nn.Linear(width, head_size, bias=False)
        self.value = nn.Linear(width, head_size, bias=False)

    def __call__(self, x):
        return attention(self.query(x), self.key(x), self.value(x))


one_head = build_and_train("one head", lambda: [Head(WIDTH, WIDTH)])
print(f"bigram baseline: {bigram_loss:.2f} nats")
assert results["one head"] < bigram_loss

# %% [markdown] id="gpt-44"
# ### Step 2: several heads
#
# One head computes one weighting of the past per position: it cannot at once look at the
# previous character *and* at the start of the word. Four heads of size 16 can, each with its
# own queries and keys, for a few more parameters (the Linear that mixes them). As in
# `transformer.py`, one `Linear(C, 3C)` makes q, k and v for all heads at once and the heads are
# a reshape, not a loop: (B, T, C) becomes (B, heads, T, C / heads), and `attention` works on
# the last two axes of every head together. A last Linear (`proj`) mixes what the heads found.

# %% id="gpt-45"
class MultiHeadAttention:
    """`heads` heads of causal self-attention side by side, mixed by a Linear."""

    def __init__(self, width, heads):
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def __call__(self, x):
        batch, length, width = x.shape
        q, k, v = [t.reshape(batch, length, self.heads, width // self.heads).transpose(1, 2)
                   for t in self.qkv(x).split(width, dim=-1)]     # (B, heads, T, head size)
        y = attention(q, k, v).transpose(1, 2).reshape(batch, length, width)
        return self.proj(y)


multi_head = build_and_train("4 heads", lambda: [MultiHeadAttention(WIDTH, HEADS)])
assert results["4 heads"] < results["one head"]

# %% [markdown] id="gpt-46"
# ### Step 3: an MLP after the attention
#
# Attention only *averages* values; what a position does with what it gathered is linear. An
# MLP on each position adds computation: Linear (C → 4C), GELU, Linear (4C → C), as in GPT-2.
# It doubles the parameters — and, stacked straight after the attention, it makes the model
# *worse* within our 300 steps:

# %% id="gpt-47"
class MLP:
    """Linear (C -> 4C), GELU, Linear (4C -> C), on each position on its own."""

    def __init__(self, width):
        self.fc = nn.Linear(width, 4 * width)
        self.proj = nn.Linear(4 * width, width)

    def __call__(self, x):
        return self.proj(self.fc(x).gelu())


with_mlp = build_and_train("4 heads + MLP", lambda: [MultiHeadAttention(WIDTH, HEADS),
                                                     MLP(WIDTH)])
assert results["4 heads + MLP"] > results["4 heads"]

# %% [markdown] id="gpt-48"
# ### Step 4: residual connections
#
# The deeper stack is harder to train: every signal, forward and backward, now passes through
# both layers, and at the start both are random maps. A **residual connection** gives each
# layer a way around itself: `x + layer(x)` instead of `layer(x)`. The vector at each position
# becomes a *residual stream* that every layer reads and adds to; the character embedding
# reaches the head unchanged unless a layer changes it, and since the gradient of
# `x + f(x)` is `1 + f'(x)`, the loss's gradient reaches the embeddings directly too. The same
# two layers, each with its way around:

# %% id="gpt-49"
class Residual:
    """x + layer(x): the layer adds to the residual stream instead of replacing it."""

    def __init__(self, layer):
        self.layer = layer

    def __call__(self, x):
        return x + self.layer(x)


residual = build_and_train("residuals", lambda: [Residual(MultiHeadAttention(WIDTH, HEADS)),
                                                 Residual(MLP(WIDTH))])
assert results["residuals"] < results["4 heads"] < bigram_loss

# %% [markdown] id="gpt-50"
# That is the largest step of all. Two things changed at once: each character's own embedding
# now reaches the head past the attention (step 1's head had to attend to itself to know it),
# and the training reaches both layers through their ways around. (Which of the two pays how
# much: see the Try it at the end.)
#
# ### Step 5: LayerNorm, and the transformer block
#
# The residual stream's scale drifts as layers add to it, and each layer sees whatever scale
# arrives. **LayerNorm** (chapter 11) normalizes each position's vector to mean 0 and variance 1
# (then scales and shifts it by learned weights) before a layer reads it: *pre-norm*, as in
# GPT-2, so the stream itself is never normalized, only what each layer reads. With one more
# LayerNorm before the head, this is a GPT's **block**, the structure of `Block` in
# `transformer.py`:

# %% id="gpt-51"
class Block:
    """A pre-norm transformer block: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, width, heads):
        self.norm1 = nn.LayerNorm(width)
        self.attention = MultiHeadAttention(width, heads)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = MLP(width)

    def __call__(self, x):
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


one_block = build_and_train("block (+ LayerNorm)", lambda: [Block(WIDTH, HEADS),
                                                            nn.LayerNorm(WIDTH)])
assert results["block (+ LayerNorm)"] < results["residuals"]

# %% [markdown] id="gpt-52"
# ### The GPT: two blocks, trained longer
#
# A GPT is a stack of such blocks. Two of them, trained for 400 steps; a deeper model wants a
# smaller step, so the learning rate is 5e-3 (at 1e-2 these two blocks end worse than the one
# block above: try it).

# %% id="gpt-53"
gpt = build_and_train("GPT, 2 blocks", lambda: [Block(WIDTH, HEADS), Block(WIDTH, HEADS),
                                                nn.LayerNorm(WIDTH)], steps=400, lr=5e-3)
print()
for name, loss in results.items():
    print(f"  {name:20} {loss:.2f} nats  {'#' * round(20 * (loss - 1.5))}")
print(f"\nbigram baseline: {bigram_loss:.2f} nats")
print(f"validation loss: {results['GPT, 2 blocks']:.2f} nats")
assert results["GPT, 2 blocks"] < results["block (+ LayerNorm)"]
assert results["GPT, 2 blocks"] < bigram_loss - 0.5

# %% [markdown] id="gpt-54"
# Each piece paid, except the MLP stacked without a way around it: from the bigram model's loss
# to well below it. (The training loss, printed above, is lower than the validation loss by the
# last steps: the models begin to learn the training text itself, 73k characters, each seen
# about four times in 300 steps of 32 windows of 32.)
#
# ### Samples
#
# To write, the model predicts a distribution for the next character, we draw one (with
# temperature 0.8, from the 10 likeliest, by `sample_token`, on the host in numpy), append it and
# predict again. The model always takes a window of 32 characters, so that one TinyJit capture
# serves every call: a prompt shorter than 32 is padded at the end, and since attention is
# causal, the padding after position t cannot change the logits at t. (The KV cache below is
# the way that does not recompute the window every time.) The text depends on the Python
# version whose docstrings were read, so this output is not compared:

# %% id="gpt-55"
# NBVAL_IGNORE_OUTPUT
def generate(model, prompt, count, temperature=0.8, top_k=10, seed=0):
    """`count` characters after `prompt`, one at a time from the model's last window."""
    rng = np.random.default_rng(seed)
    logits_of = TinyJit(lambda window: model(window).realize())
    tokens = tokenizer.encode(prompt)
    for _ in range(count):
        window = tokens[-CONTEXT:]
        padded = window + [0] * (CONTEXT - len(window))
        logits = logits_of(Tensor([padded], dtype="int32")).numpy()[0, len(window) - 1]
        tokens.append(sample_token(logits, temperature, top_k, rng))
    return tokenizer.decode(tokens)


for prompt in ("Return the ", "The default "):
    sample = generate(gpt, prompt, 200)
    print(sample, end="\n\n")
    words = sample.split()
    assert sum(c.isalpha() or c.isspace() for c in sample) / len(sample) > 0.85
    assert {"the", "of", "is", "to", "a"} & set(words)

# %% [markdown] id="gpt-56"
# ## The same GPT in the library
#
# `GPT` in `transformer.py` is the model of step 5 with its blocks stacked: embeddings, `layers`
# blocks (the same `Block`: `CausalSelfAttention` is our `MultiHeadAttention`, `MLP` our MLP),
# a last LayerNorm and the head:
#
# ```
# x = token_embedding(tokens) + position_embedding(arange(T))
# for each block:  x = x + attention(norm1(x));  x = x + mlp(norm2(x))   # mlp: C -> 4C -> C, GELU
# logits = norm(x) @ token_embedding.weight.T                             # the head is tied
# ```
#
# Two differences from ours. The head reuses the token embedding's weight (*weight tying*): the
# same matrix reads a token in and scores it on the way out. And weights start as GPT-2's,
# normal with std 0.02 (the residual projections smaller still), so the first logits are almost
# zero and the first loss is almost ln 96. Its attention is `scaled_dot_product_attention`, the
# same kernels as ours (`gpt-12`). `examples/gpt.py` trains it; here a small one shows what the
# library adds for generation:

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
assert sampler.jitted_step.captured.var_vals == {"start_pos": len(prefix) - 1}  # last replay

# %% [markdown] id="gpt-57"
# At position 3 the scores loop runs over 4 slots, at position 31 over 32: the work grows with
# the text, as it should, and nothing is compiled again. (The cache write, `E_2_32_24`, still
# passes over all 32 slots: an assign in tinyteach writes a whole buffer. tinygrad assigns into
# the view `cache[:, :, start_pos:start_pos+1]` instead.) Where the position was an input
# Tensor instead of a Variable, every step would attend over all 32 slots and mask the tail
# away: half of the work wasted, on average — little for a 32-token context, a lot for a long
# one.

# %% [markdown] id="gpt-25"
# `python examples/gpt.py` trains the library's 0.8M-parameter model (4 blocks of width 128,
# context 64) for a few minutes and samples 300 characters; `--steps`, `--device`, `--load` and
# the sampling options are its arguments. `python benchmarks/gpt.py` times a training step and
# a generation step against PyTorch.
#
# **Try it.**
#
# - Replace `attention` in `gpt-08` by a version without the max subtraction
#   (`scores.exp() / scores.exp().sum(...)`). How many kernels does it become, and which
#   reason disappears? Then feed it scores of 100 and see why the max is there. Does
#   `online_softmax_attention` still need its running max?
# - Train step 3's model (attention, then the MLP, no residuals) for 1,000 steps instead of
#   300. Does the MLP pay in the end, or only with the residuals? And step 4 without its MLP,
#   `[Residual(MultiHeadAttention(WIDTH, HEADS))]`: how much of step 4's gain is the MLP's?
# - Train the two-block GPT of `gpt-53` with `lr=1e-2`, and with three blocks.
