"""Chapter 11b: the GPT against PyTorch, and the KV cache against recomputing the prefix.

- training: the example's own TinyJit'd step (examples/gpt.py: loss, backward, clip_grad_norm_,
  AdamW with a cosine learning rate) and a PyTorch re-implementation of the same model, started
  from the same weights and fed the same batches, give the same loss at each of 20 steps and
  the same weights after them;
- generation: the static KV cache under TinyJit gives the logits of a full forward pass at
  every position, and greedy generation gives the tokens of recomputing the whole window;
- the pieces: clip_grad_norm_ and cosine_lr against torch, sampling, the tokenizer, the corpus,
  checkpoints, and the errors for bad input.
"""
from __future__ import annotations

import importlib.util
import inspect
import math
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from helpers import ALWAYS, default_device

from tinyteach import Tensor, TinyJit, UOp
from tinyteach.nn.state import get_parameters, get_state_dict
from tinyteach.nn.transformer import (
    GPT,
    CharTokenizer,
    GPTConfig,
    KVCache,
    Sampler,
    clip_grad_norm_,
    cosine_lr,
    sample_token,
    start_pos_variable,
    stdlib_docstrings,
)

torch = pytest.importorskip("torch")
F = torch.nn.functional

SMALL = GPTConfig(vocab_size=13, block_size=8, embed_size=16, layers=2, heads=2)
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "gpt.py"


# the reference interpreter and generated C; the GPU emulator (PYTHON) runs these graphs too,
# but the 20-step training takes minutes there, and tests/test_backends.py covers its training
DEVICES = [name for name in ALWAYS if name != "PYTHON"]


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> Iterator[str]:
    with default_device(request.param):
        yield request.param


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpt_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- the same model in PyTorch ----

class TorchGPT(torch.nn.Module):
    """GPT written with torch.nn: pre-norm blocks, causal attention, GELU (tanh), tied head."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        width = config.embed_size
        self.config = config
        self.token_embedding = torch.nn.Embedding(config.vocab_size, width)
        self.position_embedding = torch.nn.Embedding(config.block_size, width)
        self.blocks = torch.nn.ModuleList(torch.nn.ModuleDict({
            "norm1": torch.nn.LayerNorm(width), "qkv": torch.nn.Linear(width, 3 * width),
            "attn_proj": torch.nn.Linear(width, width), "norm2": torch.nn.LayerNorm(width),
            "fc": torch.nn.Linear(width, 4 * width), "mlp_proj": torch.nn.Linear(4 * width, width),
        }) for _ in range(config.layers))
        self.norm = torch.nn.LayerNorm(width)

    def attention(self, block: Any, x: Any) -> Any:
        batch, length, width = x.shape
        heads = self.config.heads
        q, k, v = block["qkv"](x).split(width, dim=-1)
        q, k, v = (t.reshape(batch, length, heads, width // heads).transpose(1, 2)
                   for t in (q, k, v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(width // heads)
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        y = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v
        return block["attn_proj"](y.transpose(1, 2).reshape(batch, length, width))

    def forward(self, tokens: Any) -> Any:
        positions = torch.arange(tokens.shape[1])
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        for block in self.blocks:
            x = x + self.attention(block, block["norm1"](x))
            x = x + block["mlp_proj"](F.gelu(block["fc"](block["norm2"](x)), approximate="tanh"))
        return self.norm(x) @ self.token_embedding.weight.T


def torch_names(name: str) -> str:
    """Our state-dict name -> the TorchGPT parameter it matches."""
    for ours, theirs in (("attention.qkv", "qkv"), ("attention.proj", "attn_proj"),
                         ("mlp.fc", "fc"), ("mlp.proj", "mlp_proj")):
        name = name.replace(ours, theirs)
    return name


def torch_copy(model: GPT) -> Any:
    theirs = TorchGPT(model.config)
    state = {torch_names(k): torch.tensor(v.numpy()) for k, v in get_state_dict(model).items()}
    theirs.load_state_dict(state, strict=True)
    return theirs


# ---- training ----

def test_every_parameter_has_its_own_buffer() -> None:
    """Two LayerNorms start as the same graph (ones); each must still train on its own."""
    model = GPT(SMALL)
    parameters = get_parameters(model)
    assert len({id(p.uop) for p in parameters}) == len(parameters) == 2 + 12 * SMALL.layers + 2

def test_training_matches_pytorch_for_20_steps(device: str) -> None:
    example = load_example()
    Tensor.manual_seed(3)
    model = GPT(SMALL)
    theirs = torch_copy(model)
    steps, max_lr, batch = 20, 3e-3, 4
    optimizer = example.nn.optim.AdamW(get_parameters(model), lr=max_lr, b2=0.99,
                                       weight_decay=0.1)
    train_step = example.make_train_step(model, optimizer, max_norm=1.0)
    torch_optimizer = torch.optim.AdamW(theirs.parameters(), lr=max_lr, betas=(0.9, 0.99),
                                        eps=1e-8, weight_decay=0.1)
    rng = np.random.default_rng(0)
    data = rng.integers(0, SMALL.vocab_size, 500).astype(np.int32)
    for step in range(steps):
        lr = cosine_lr(step, max_lr, steps, warmup_steps=3, min_lr=max_lr / 10)
        inputs, targets = example.random_batch(data, batch, SMALL.block_size, rng)
        optimizer.lr.assign(Tensor(lr)).realize()
        loss, norm = train_step(Tensor(inputs), Tensor(targets))

        for group in torch_optimizer.param_groups:
            group["lr"] = lr
        torch_optimizer.zero_grad()
        logits = theirs(torch.tensor(inputs, dtype=torch.long))
        torch_loss = F.cross_entropy(logits.reshape(-1, SMALL.vocab_size),
                                     torch.tensor(targets.reshape(-1), dtype=torch.long))
        torch_loss.backward()
        torch_norm = torch.nn.utils.clip_grad_norm_(theirs.parameters(), 1.0)
        torch_optimizer.step()
        np.testing.assert_allclose(loss.item(), torch_loss.item(), rtol=1e-4, atol=1e-5,
                                   err_msg=f"loss at step {step}")
        np.testing.assert_allclose(norm.item(), torch_norm.item(), rtol=1e-3, atol=1e-5,
                                   err_msg=f"gradient norm at step {step}")
    for name, value in get_state_dict(model).items():
        expected = theirs.state_dict()[torch_names(name)].numpy()
        np.testing.assert_allclose(value.numpy(), expected, rtol=1e-3, atol=1e-4, err_msg=name)


def test_forward_matches_pytorch_with_longer_context(device: str) -> None:
    Tensor.manual_seed(5)
    config = GPTConfig(vocab_size=11, block_size=16, embed_size=24, layers=3, heads=3)
    model = GPT(config)
    tokens = np.random.default_rng(1).integers(0, 11, (2, 16))
    expected = torch_copy(model)(torch.tensor(tokens)).detach().numpy()
    np.testing.assert_allclose(model(Tensor(tokens.astype(np.int32))).numpy(), expected,
                               rtol=1e-4, atol=1e-5)


def test_clip_grad_norm_matches_pytorch(device: str) -> None:
    rng = np.random.default_rng(2)
    values = [rng.standard_normal(shape).astype(np.float32) for shape in ((3, 4), (5,))]
    for max_norm in (0.5, 100.0):  # clipped, and left alone
        ours = [Tensor(v, requires_grad=True) for v in values]
        theirs = [torch.tensor(v, requires_grad=True) for v in values]
        sum((t * t * t).sum() for t in ours).backward()
        sum((t * t * t).sum() for t in theirs).backward()
        norm = clip_grad_norm_(ours, max_norm)
        expected = torch.nn.utils.clip_grad_norm_(theirs, max_norm)
        np.testing.assert_allclose(norm.item(), expected.item(), rtol=1e-5)
        for a, b in zip(ours, theirs):
            assert a.grad is not None
            np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_clip_grad_norm_needs_gradients() -> None:
    with pytest.raises(ValueError, match="no parameter has a gradient"):
        clip_grad_norm_([Tensor([1.0])], 1.0)


def test_cosine_lr_is_torchs_cosine_annealing_after_warmup() -> None:
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=0.1)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=30, eta_min=0.01)
    for step in range(30):
        assert cosine_lr(step, 0.1, 30, min_lr=0.01) == pytest.approx(
            optimizer.param_groups[0]["lr"], rel=1e-9)
        optimizer.step()
        schedule.step()
    assert cosine_lr(40, 0.1, 30, min_lr=0.01) == 0.01
    warmup = [cosine_lr(step, 0.1, 30, warmup_steps=4) for step in range(4)]
    np.testing.assert_allclose(warmup, [0.025, 0.05, 0.075, 0.1])


# ---- generation with the KV cache ----

def test_cached_logits_match_the_full_forward_at_every_position(device: str) -> None:
    Tensor.manual_seed(7)
    model = GPT(SMALL)
    tokens = [3, 5, 7, 1, 2, 9, 11, 4]
    full = model(Tensor([tokens])).numpy()[0]
    sampler = Sampler(model)
    for position, token in enumerate(tokens):
        np.testing.assert_allclose(sampler.logits(token, position), full[position], rtol=1e-4,
                                   atol=1e-5, err_msg=f"position {position}")
    assert sampler.jitted_step.calls == len(tokens)  # captured once, replayed for the rest
    assert sampler.jitted_step.captured is not None


def test_one_capture_over_a_symbolic_length_serves_every_position() -> None:
    """The step's attention is over start_pos+1 positions, a symbolic size: TinyJit captured
    it once (its function ran twice, at positions 0 and 1), and every later position replays
    the same compiled kernels with a new `start_pos` value."""
    Tensor.manual_seed(9)
    model = GPT(SMALL)
    tokens = [2, 4, 6, 8, 1, 3, 5, 7]
    full = model(Tensor([tokens])).numpy()[0]
    sampler = Sampler(model)
    runs = []
    step = sampler._step

    def counted(token: Tensor, start_pos: UOp) -> Tensor:
        runs.append(start_pos)
        return step(token, start_pos)
    sampler.jitted_step = TinyJit(counted)
    for position, token in enumerate(tokens):
        np.testing.assert_allclose(sampler.logits(token, position), full[position],
                                   rtol=1e-4, atol=1e-5, err_msg=f"position {position}")
    assert len(runs) == 2  # run once, captured once; positions 2..7 replayed
    captured = sampler.jitted_step.captured
    assert captured is not None and captured.symbolic
    symbolic = [launch for launch in captured.launches if launch.var_vals]
    assert symbolic and all(launch.var_vals == {"start_pos": len(tokens) - 1}
                            for launch in symbolic)
    sources = {launch.runner.source for launch in symbolic if launch.runner is not None
               and launch.runner.source is not None and "start_pos" in launch.runner.source}
    assert any("const int start_pos" in source for source in sources)


def greedy_by_recomputing(model: GPT, prompt: list[int], count: int) -> list[int]:
    """Greedy tokens, each from a full forward pass over the window the Sampler's cache holds
    (the window restarts from the last half of the text when it is full)."""
    block = model.config.block_size
    window, everything = prompt[-block:], list(prompt)
    for _ in range(count):
        logits = model(Tensor([window])).numpy()[0, -1]
        everything.append(int(np.argmax(logits)))
        window = everything[-(block // 2):] if len(window) == block else window + everything[-1:]
    return everything[len(prompt):]


def test_cached_generation_gives_the_tokens_of_recomputing(device: str) -> None:
    Tensor.manual_seed(8)
    model = GPT(SMALL)
    prompt = [1, 2, 3]
    count = 12  # crosses the block of 8, so the window slides once
    generated = Sampler(model).generate(prompt, count, temperature=0.0)
    assert generated == greedy_by_recomputing(model, prompt, count)


def test_kv_cache_write_touches_only_its_position() -> None:
    cache = KVCache(batch=1, heads=1, max_length=4, head_size=2)
    key = Tensor([[[[1.0, 2.0]]]])
    start_pos = start_pos_variable(4).bind(2)
    cache.write(start_pos, key, key * 10)
    Tensor.realize(cache.keys, cache.values)
    expected = np.zeros((1, 1, 4, 2), np.float32)
    expected[0, 0, 2] = [1.0, 2.0]
    np.testing.assert_array_equal(cache.keys.numpy(), expected)
    np.testing.assert_array_equal(cache.values.numpy(), expected * 10)
    keys, values = cache.seen(start_pos)  # slots 0..2: a symbolic length of start_pos+1
    assert str(keys.shape) == "(1, 1, (start_pos+1), 2)"
    np.testing.assert_array_equal(keys.numpy(), expected[:, :, :3])
    np.testing.assert_array_equal(values.numpy(), expected[:, :, :3] * 10)


def test_sample_token_keeps_to_the_top_k() -> None:
    logits = np.array([0.0, 3.0, 1.0, 2.5, -1.0], dtype=np.float32)
    rng = np.random.default_rng(0)
    draws = {sample_token(logits, 1.0, top_k=2, rng=rng) for _ in range(200)}
    assert draws == {1, 3}
    assert sample_token(logits, 0.0) == 1
    frequencies = np.bincount([sample_token(logits, 2.0, rng=rng) for _ in range(4000)],
                              minlength=5) / 4000
    expected = np.exp(logits / 2.0) / np.exp(logits / 2.0).sum()
    np.testing.assert_allclose(frequencies, expected, atol=0.03)


@pytest.mark.parametrize("temperature, top_k", [(-1.0, None), (1.0, 0)])
def test_sample_token_rejects_bad_arguments(temperature: float, top_k: int | None) -> None:
    with pytest.raises(ValueError, match="temperature must be"):
        sample_token(np.zeros(3, np.float32), temperature, top_k)


def test_sampler_errors() -> None:
    model = GPT(SMALL)
    sampler = Sampler(model)
    with pytest.raises(ValueError, match="outside the cache"):
        sampler.logits(1, SMALL.block_size)
    with pytest.raises(ValueError, match="at least one token"):
        sampler.generate([], 3)


# ---- the model's errors, the text, checkpoints ----

def test_config_and_input_errors() -> None:
    with pytest.raises(ValueError, match="does not split into 3 heads"):
        GPTConfig(vocab_size=10, embed_size=16, heads=3)
    with pytest.raises(ValueError, match="must be positive"):
        GPTConfig(vocab_size=0)
    with pytest.raises(ValueError, match="length <= 8"):
        GPT(SMALL)(Tensor([[1] * 9]))


def test_tokenizer_round_trip_and_unknown_characters() -> None:
    tokenizer = CharTokenizer.printable()
    assert tokenizer.vocab_size == 96
    text = "def f(x):\n    return x ~ 1"
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.decode(tokenizer.encode("é\t")) == "??"
    with pytest.raises(ValueError, match="distinct characters"):
        CharTokenizer("aa?")


def test_corpus_is_the_docstrings_of_the_listed_modules() -> None:
    import abc
    import textwrap

    text = stdlib_docstrings(("abc", "textwrap"))
    assert text == stdlib_docstrings(("abc", "textwrap"))
    assert inspect.cleandoc(abc.__doc__ or "") in text
    assert inspect.cleandoc(textwrap.TextWrapper.__doc__ or "") in text
    assert inspect.cleandoc(abc.abstractmethod.__doc__ or "") in text
    with pytest.raises(FileNotFoundError, match="no_such_module"):
        stdlib_docstrings(("no_such_module",))


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    example = load_example()
    Tensor.manual_seed(9)
    model = GPT(SMALL)
    path = str(tmp_path / "gpt.safetensors")
    example.save(model, path)
    loaded = example.load(path)
    assert loaded.config == model.config
    tokens = Tensor([[1, 4, 2, 8]])
    np.testing.assert_array_equal(loaded(tokens).numpy(), model(tokens).numpy())
