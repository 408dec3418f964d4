"""Chapter 11b: Attention and a small GPT — the capstone, built from the layers of chapter 11.

What this teaches:
- text becomes integers (`CharTokenizer`: one token per character) and integers become vectors
  (`nn.Embedding`: a row of a weight matrix, picked by a one-hot matrix product);
- causal self-attention: every position mixes the values of the positions before it, weighted
  by softmax(q k^T / sqrt(d)) — written on `Tensor.scaled_dot_product_attention`, which is
  itself matmul -> mask -> softmax -> matmul built from the primitive ops;
- a GPT is embeddings, a stack of blocks (x + attention(norm(x)), then x + mlp(norm(x))), a last
  norm and a head that shares the token embedding's weight (weight tying);
- generation one token at a time with a KV cache over a *symbolic* length, as tinygrad's:
  the cache is preallocated at the maximum length, the position is a bound Variable
  (`START_POS.bind(p)`), each step writes slot p and attends over `cache[:, :, :p+1]` — a
  size that is the variable. Its kernels are compiled once, for every position (the length is
  an `int start_pos` parameter), so TinyJit captures the step once and replays it for every
  position, and a step attends over p+1 positions, not the whole maximum length;
- the training tools a GPT run uses: `clip_grad_norm_` (scale every gradient so their joint
  norm is at most a bound) and `cosine_lr` (linear warmup, then a cosine decay);
- a corpus that is on every machine: the docstrings of a fixed list of Python's standard
  library modules, read with `ast` (no module is imported).

Builds on: nn (Linear, Embedding, LayerNorm), tensor/nn.py (scaled_dot_product_attention,
gelu, layernorm). Used by: examples/gpt.py, benchmarks/gpt.py, chapters/11b_gpt.ipynb.

>>> from tinyteach import Tensor
>>> model = GPT(GPTConfig(vocab_size=10, block_size=8, embed_size=16, layers=1, heads=2))
>>> model(Tensor([[1, 2, 3]])).shape
(1, 3, 10)
"""
from __future__ import annotations

import ast
import math
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tinyteach.engine.jit import TinyJit
from tinyteach.ir.uop import UOp, Variable
from tinyteach.nn import Embedding, LayerNorm, Linear
from tinyteach.nn.state import get_parameters
from tinyteach.tensor import Tensor

__all__ = ["GPTConfig", "CausalSelfAttention", "MLP", "Block", "GPT", "KVCache", "Sampler",
           "start_pos_variable",
           "sample_token", "CharTokenizer", "clip_grad_norm_", "cosine_lr",
           "stdlib_docstrings", "STDLIB_MODULES"]


@dataclass(frozen=True)
class GPTConfig:
    """The sizes of a GPT: vocabulary, context length, width, depth and heads."""

    vocab_size: int
    block_size: int = 64
    embed_size: int = 128
    layers: int = 4
    heads: int = 4
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.embed_size % self.heads:
            raise ValueError(f"embed_size {self.embed_size} does not split into {self.heads} "
                             "heads")
        if min(self.vocab_size, self.block_size, self.layers) < 1:
            raise ValueError(f"vocab_size, block_size and layers must be positive: {self}")


def _normal(shape: tuple[int, ...], std: float) -> Tensor:
    return Tensor.normal(*shape, std=std).contiguous()


def _init_linear(layer: Linear, std: float) -> Linear:
    """GPT-2's initialization: weights normal(0, std), biases zero."""
    layer.weight = _normal(layer.weight.shape, std)
    if layer.bias is not None:
        layer.bias = Tensor.zeros(*layer.bias.shape).contiguous()
    return layer


# ---- attention ----

def start_pos_variable(max_length: int) -> UOp:
    """The position of a generation step: a Variable over 0..max_length-1 (bind it to the
    position of each step: `start_pos_variable(64).bind(p)`)."""
    return Variable("start_pos", 0, max_length - 1)


class KVCache:
    """The keys and values of every position seen so far, for one layer: two buffers of shape
    (batch, heads, max_length, head_size), preallocated. Position p (a bound Variable) is
    written by `write`; `seen(p)` is the keys and values of positions 0..p, a view of
    symbolic length p+1 (the slots after p, never written yet, are not in it)."""

    def __init__(self, batch: int, heads: int, max_length: int, head_size: int):
        shape = (batch, heads, max_length, head_size)
        self.max_length = max_length
        self.keys = Tensor.zeros(*shape).contiguous().realize()
        self.values = Tensor.zeros(*shape).contiguous().realize()

    def write(self, start_pos: UOp, key: Tensor, value: Tensor) -> None:
        """Store key and value (batch, heads, 1, head_size) at slot `start_pos` (a bound
        Variable), in place: the new cache is where(slot == start_pos, new, old), one kernel
        for every position (the position is its `int start_pos` parameter)."""
        slots = Tensor.arange(self.max_length, device=key.device)
        hit = (slots == Tensor(start_pos, key.device)).reshape(1, 1, self.max_length, 1)
        self.keys.assign(hit.where(key, self.keys))
        self.values.assign(hit.where(value, self.values))

    def seen(self, start_pos: UOp) -> tuple[Tensor, Tensor]:
        """The keys and values of slots 0..start_pos: (batch, heads, start_pos+1, head_size)."""
        length = ((0, start_pos + 1),)
        return (self.keys.shrink((None, None, *length, None)),
                self.values.shrink((None, None, *length, None)))


class CausalSelfAttention:
    """Multi-head causal self-attention: one Linear makes q, k and v for every head, each
    position attends to itself and the positions before it, and a Linear mixes the heads."""

    def __init__(self, embed_size: int, heads: int, dropout: float = 0.0):
        if embed_size % heads:
            raise ValueError(f"embed_size {embed_size} does not split into {heads} heads")
        self.heads, self.dropout = heads, dropout
        self.qkv = Linear(embed_size, 3 * embed_size)
        self.proj = Linear(embed_size, embed_size)

    def _split_heads(self, x: Tensor) -> Tensor:
        """(B, T, C) -> (B, heads, T, C / heads)."""
        batch, length, width = x.shape
        return x.reshape(batch, length, self.heads, width // self.heads).transpose(1, 2)

    @staticmethod
    def _merge_heads(y: Tensor) -> Tensor:
        """(B, heads, T, head_size) -> (B, T, heads * head_size)."""
        batch, heads, length, head_size = y.shape
        return y.transpose(1, 2).reshape(batch, length, heads * head_size)

    def queries_keys_values(self, x: Tensor) -> list[Tensor]:
        width = x.shape[-1]
        return [self._split_heads(t) for t in self.qkv(x).split(width, dim=-1)]

    def __call__(self, x: Tensor) -> Tensor:
        """x (B, T, C) -> (B, T, C); position t sees positions 0..t."""
        q, k, v = self.queries_keys_values(x)
        y = q.scaled_dot_product_attention(k, v, is_causal=True, dropout_p=self.dropout)
        return self.proj(self._merge_heads(y)).dropout(self.dropout)

    def step(self, x: Tensor, start_pos: UOp, cache: KVCache) -> Tensor:
        """x (B, 1, C), the token at `start_pos` (a bound Variable): store its key and value in
        the cache, attend to the cache's slots 0..start_pos (all before it: no mask), and
        return (B, 1, C)."""
        q, k, v = self.queries_keys_values(x)
        cache.write(start_pos, k, v)
        keys, values = cache.seen(start_pos)
        y = q.scaled_dot_product_attention(keys, values)
        return self.proj(self._merge_heads(y))


class MLP:
    """Linear (C -> 4C), GELU (tanh approximation, as GPT-2), Linear (4C -> C)."""

    def __init__(self, embed_size: int, dropout: float = 0.0):
        self.fc = Linear(embed_size, 4 * embed_size)
        self.proj = Linear(4 * embed_size, embed_size)
        self.dropout = dropout

    def __call__(self, x: Tensor) -> Tensor:
        return self.proj(self.fc(x).gelu()).dropout(self.dropout)


class Block:
    """A pre-norm transformer block: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, embed_size: int, heads: int, dropout: float = 0.0):
        self.norm1 = LayerNorm(embed_size)
        self.attention = CausalSelfAttention(embed_size, heads, dropout)
        self.norm2 = LayerNorm(embed_size)
        self.mlp = MLP(embed_size, dropout)

    def __call__(self, x: Tensor) -> Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))

    def step(self, x: Tensor, start_pos: UOp, cache: KVCache) -> Tensor:
        x = x + self.attention.step(self.norm1(x), start_pos, cache)
        return x + self.mlp(self.norm2(x))


# ---- the model ----

class GPT:
    """Token and position embeddings, `layers` blocks, a last LayerNorm, and a head whose
    weight is the token embedding's (tied: one matrix reads tokens in and writes logits out).
    Weights start as GPT-2's: normal(0, 0.02), the residual projections 0.02 / sqrt(2 layers)
    so the residual stream's variance does not grow with depth; biases zero, norms one."""

    def __init__(self, config: GPTConfig):
        self.config = config
        width = config.embed_size
        self.token_embedding = Embedding(config.vocab_size, width)
        self.position_embedding = Embedding(config.block_size, width)
        self.blocks = [Block(width, config.heads, config.dropout) for _ in range(config.layers)]
        self.norm = LayerNorm(width)
        self._initialize()

    def _initialize(self) -> None:
        for embedding in (self.token_embedding, self.position_embedding):
            embedding.weight = _normal(embedding.weight.shape, 0.02)
        residual_std = 0.02 / math.sqrt(2 * self.config.layers)
        for block in self.blocks:
            _init_linear(block.attention.qkv, 0.02)
            _init_linear(block.attention.proj, residual_std)
            _init_linear(block.mlp.fc, 0.02)
            _init_linear(block.mlp.proj, residual_std)
        # one realize per parameter: equal graphs are one UOp (Tensor.ones(C) of two LayerNorms,
        # two zero biases), and realized together they would share one buffer (and a gradient)
        for parameter in get_parameters(self):
            parameter.realize()

    def parameter_count(self) -> int:
        return sum(p.numel() for p in get_parameters(self))

    def _logits(self, x: Tensor) -> Tensor:
        return self.norm(x) @ self.token_embedding.weight.transpose()

    def __call__(self, tokens: Tensor) -> Tensor:
        """tokens (B, T) ints, T <= block_size -> logits (B, T, vocab_size)."""
        length = tokens.shape[-1]
        if tokens.ndim != 2 or length > self.config.block_size:
            raise ValueError(f"GPT needs tokens of shape (batch, length <= "
                             f"{self.config.block_size}), got {tokens.shape}")
        positions = Tensor.arange(length, device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        x = x.dropout(self.config.dropout)
        for block in self.blocks:
            x = block(x)
        return self._logits(x)

    def loss(self, tokens: Tensor, targets: Tensor) -> Tensor:
        """The mean cross-entropy of predicting targets[b, t] (the token after tokens[b, t])."""
        logits = self(tokens)
        return logits.reshape(-1, self.config.vocab_size).sparse_categorical_crossentropy(
            targets.reshape(-1))

    def new_cache(self, batch: int = 1) -> list[KVCache]:
        """An empty KV cache for every layer, of the model's full context length."""
        head_size = self.config.embed_size // self.config.heads
        return [KVCache(batch, self.config.heads, self.config.block_size, head_size)
                for _ in self.blocks]

    def step(self, token: Tensor, start_pos: UOp, caches: Sequence[KVCache]) -> Tensor:
        """One generation step: token (B, 1) at `start_pos` (a bound Variable, see
        `start_pos_variable`) -> the logits of the next token (B, vocab_size). Reads and
        writes the caches. The attention's length is start_pos+1, a symbolic size: a TinyJit
        of this function captures once and serves every position."""
        position = Tensor(start_pos, token.device).reshape(1, 1)
        x = self.token_embedding(token) + self.position_embedding(position)
        for block, cache in zip(self.blocks, caches):
            x = block.step(x, start_pos, cache)
        return self._logits(x).reshape(token.shape[0], self.config.vocab_size)


# ---- generation ----

def sample_token(logits: np.ndarray, temperature: float = 1.0, top_k: int | None = None,
                 rng: np.random.Generator | None = None) -> int:
    """Draw a token from logits (vocab_size,): softmax(logits / temperature) over the top_k
    largest (all when None). temperature 0 takes the largest (greedy). On the host: a vocabulary
    of ~100 is cheaper to sort in numpy than in a kernel."""
    if temperature < 0 or (top_k is not None and top_k < 1):
        raise ValueError(f"temperature must be >= 0 and top_k >= 1, got {temperature}, {top_k}")
    if temperature == 0:
        return int(np.argmax(logits))
    scaled = logits.astype(np.float64) / temperature
    if top_k is not None and top_k < len(scaled):
        cutoff = np.sort(scaled)[-top_k]
        scaled = np.where(scaled >= cutoff, scaled, -np.inf)
    probabilities = np.exp(scaled - scaled.max())
    probabilities /= probabilities.sum()
    generator = rng if rng is not None else np.random.default_rng()
    return int(generator.choice(len(probabilities), p=probabilities))


class Sampler:
    """Generates text with a model's KV cache: `GPT.step` under one TinyJit, which captures
    on the second token and replays for every later one (the position is a bound Variable,
    passed to the kernels at each replay). Past the context length the window slides: the
    cache restarts from the last half."""

    def __init__(self, model: GPT):
        self.model = model
        self.caches = model.new_cache(1)
        self.start_pos = start_pos_variable(model.config.block_size)
        self.jitted_step = TinyJit(self._step)

    def _step(self, token: Tensor, start_pos: UOp) -> Tensor:
        logits = self.model.step(token, start_pos, self.caches)
        buffers = [t for cache in self.caches for t in (cache.keys, cache.values)]
        Tensor.realize(logits, *buffers)
        return logits

    def logits(self, token: int, position: int) -> np.ndarray:
        """Feed `token` at `position`; the next token's logits (vocab_size,)."""
        if not 0 <= position < self.model.config.block_size:
            raise ValueError(f"position {position} is outside the cache's 0.."
                             f"{self.model.config.block_size - 1}")
        result = self.jitted_step(Tensor([[token]], dtype="int32"),
                                  self.start_pos.bind(position))
        return result.numpy()[0]

    def _feed(self, tokens: Sequence[int]) -> np.ndarray:
        logits = np.zeros(self.model.config.vocab_size, dtype=np.float32)
        for position, token in enumerate(tokens):
            logits = self.logits(token, position)
        return logits

    def generate(self, prompt: Sequence[int], count: int, temperature: float = 1.0,
                 top_k: int | None = None, seed: int = 0) -> list[int]:
        """`count` new tokens after `prompt` (at least one token)."""
        if not prompt:
            raise ValueError("generate needs a prompt of at least one token")
        block = self.model.config.block_size
        rng = np.random.default_rng(seed)
        tokens = list(prompt[-block:])
        logits = self._feed(tokens)
        position = len(tokens)
        new: list[int] = []
        for _ in range(count):
            new.append(sample_token(logits, temperature, top_k, rng))
            if position == block:  # the cache is full: restart it from the last half
                tokens = (list(prompt) + new)[-(block // 2):]
                logits, position = self._feed(tokens), len(tokens)
            else:
                logits, position = self.logits(new[-1], position), position + 1
        return new


# ---- training tools ----

def clip_grad_norm_(parameters: Sequence[Tensor], max_norm: float) -> Tensor:
    """Scale every gradient by min(1, max_norm / (norm + 1e-6)), where norm is the Euclidean
    norm of all the gradients together (PyTorch's clip_grad_norm_). Returns that norm (lazy)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        raise ValueError("clip_grad_norm_: no parameter has a gradient (call backward first)")
    total = Tensor.stack(*[(g * g).sum() for g in grads]).sum().sqrt()
    scale = (max_norm / (total + 1e-6)).minimum(1.0)
    for p in parameters:
        if p.grad is not None:
            p.grad = p.grad * scale
    return total


def cosine_lr(step: int, max_lr: float, total_steps: int, warmup_steps: int = 0,
              min_lr: float = 0.0) -> float:
    """The learning rate at `step`: linear warmup to max_lr over warmup_steps, then a cosine
    from max_lr down to min_lr at total_steps (and min_lr after)."""
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= total_steps:
        return min_lr
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * progress))


# ---- text ----

class CharTokenizer:
    """One token per character of a fixed alphabet; characters outside it read as '?'."""

    def __init__(self, alphabet: str):
        if len(set(alphabet)) != len(alphabet) or "?" not in alphabet:
            raise ValueError("the alphabet must hold distinct characters, '?' among them")
        self.alphabet = alphabet
        self.index = {c: i for i, c in enumerate(alphabet)}

    @classmethod
    def printable(cls) -> CharTokenizer:
        """Newline, space and the 94 visible ASCII characters: 96 tokens."""
        return cls("\n" + "".join(chr(c) for c in range(32, 127)))

    @property
    def vocab_size(self) -> int:
        return len(self.alphabet)

    def encode(self, text: str) -> list[int]:
        unknown = self.index["?"]
        return [self.index.get(c, unknown) for c in text]

    def decode(self, tokens: Sequence[int]) -> str:
        return "".join(self.alphabet[int(t)] for t in tokens)


# sorted, pure-Python modules whose sources ship with every CPython 3.11+ (nothing imported)
STDLIB_MODULES = ("abc", "argparse", "ast", "base64", "bisect", "calendar", "cmd", "codecs",
                  "colorsys", "configparser", "contextlib", "copy", "csv", "dataclasses",
                  "datetime", "decimal", "difflib", "enum", "filecmp", "fnmatch", "fractions",
                  "ftplib", "functools", "getopt", "gettext", "glob", "gzip", "heapq", "hmac",
                  "imaplib", "inspect", "ipaddress", "locale", "mailbox", "numbers", "operator",
                  "optparse", "pathlib", "pickle", "pprint", "queue", "quopri", "random", "sched",
                  "secrets", "selectors", "shlex", "shutil", "smtplib", "socket", "statistics",
                  "string", "subprocess", "tarfile", "tempfile", "textwrap", "threading",
                  "timeit", "tokenize", "traceback", "typing", "uuid", "warnings", "wave",
                  "weakref", "zipfile")


def _docstrings(source: str) -> list[str]:
    """The docstrings of a module's source, in the order they appear."""
    tree = ast.parse(source)
    nodes = [tree] + [n for n in ast.walk(tree) if isinstance(
        n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    nodes.sort(key=lambda node: getattr(node, "lineno", 0))
    found = [ast.get_docstring(n) for n in nodes]
    return [doc for doc in found if doc]


def stdlib_docstrings(modules: Sequence[str] = STDLIB_MODULES) -> str:
    """Every docstring of the given standard-library modules (read from their source files),
    separated by blank lines: the same text on every machine with the same Python."""
    library = Path(sysconfig.get_paths()["stdlib"])
    texts = []
    for name in modules:
        path = library / f"{name}.py"
        if not path.exists():
            raise FileNotFoundError(f"stdlib_docstrings: {path} is not there (module {name!r})")
        texts += _docstrings(path.read_text(encoding="utf-8"))
    return "\n\n".join(texts) + "\n"

