"""Train a small character-level GPT on the standard library's docstrings, then sample from it.

    python examples/gpt.py                      # ~0.8M parameters, 250 steps (a few minutes)
    python examples/gpt.py --steps 20 --sample-length 200
    python examples/gpt.py --load --steps 0 --prompt "Return the"   # the last checkpoint

The checkpoint is written to tinyteach's cache folder, ~/.cache/tinyteach/checkpoints/
gpt.safetensors (under $TINYTEACH_CACHE when set), never into the current folder: `--save PATH`
writes it elsewhere, `--save ''` not at all; `--load` reads it back (`--load PATH`, another).

The corpus is the docstrings of a fixed list of Python's own modules (read from their sources,
so it is on every machine and needs no download); the last 10% is held out. Each training step
(forward, backward, gradient clipping, AdamW) is captured by TinyJit on its second call and
replayed afterwards; the cosine learning rate is written into the optimizer's `lr` buffer
before each step, so the replays see it. Generation runs through the model's KV cache
(tinyteach.nn.transformer.Sampler) over a symbolic length: the position is a bound Variable,
`start_pos`, so one TinyJit capture and one compiled kernel serve every position.
"""
from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from tqdm import tqdm

from tinyteach import Device, GlobalCounters, Tensor, TinyJit, nn
from tinyteach.helpers import cache_dir
from tinyteach.nn.state import get_parameters, get_state_dict, load_state_dict, safe_load, safe_save
from tinyteach.nn.transformer import (
    GPT,
    CharTokenizer,
    GPTConfig,
    Sampler,
    clip_grad_norm_,
    cosine_lr,
    stdlib_docstrings,
)

TrainStep = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]


def default_checkpoint() -> Path:
    """Where training saves and `--load` reads by default: tinyteach's cache folder."""
    return cache_dir("checkpoints") / "gpt.safetensors"


def load_corpus(tokenizer: CharTokenizer, held_out: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """The corpus as int32 tokens, split into training and held-out parts (the held-out part
    is the end of the text, so no window overlaps both)."""
    tokens = np.array(tokenizer.encode(stdlib_docstrings()), dtype=np.int32)
    split = int(len(tokens) * (1 - held_out))
    return tokens[:split], tokens[split:]


def random_batch(data: np.ndarray, batch: int, length: int,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """`batch` windows of `length` tokens at random places, and the same windows moved by one
    (the targets: each position predicts the token after it)."""
    starts = rng.integers(0, len(data) - length - 1, batch)
    inputs = np.stack([data[s:s + length] for s in starts])
    targets = np.stack([data[s + 1:s + length + 1] for s in starts])
    return inputs, targets


def make_train_step(model: GPT, optimizer: nn.optim.LAMB, max_norm: float) -> TrainStep:
    """One TinyJit'd step: loss, backward, clip, AdamW; returns (loss, gradient norm)."""
    @TinyJit
    def train_step(inputs: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        with Tensor.train():
            optimizer.zero_grad()
            loss = model.loss(inputs, targets).backward()
            norm = clip_grad_norm_(optimizer.params, max_norm)
            # the loss and the norm read the weights before the update: one realize for all
            Tensor.realize(loss, norm, *optimizer.schedule_step())
        return loss, norm
    return train_step


def make_held_out_loss(model: GPT, data: np.ndarray, batch: int,
                       batches: int = 4) -> Callable[[], float]:
    """A function that gives the mean loss over fixed windows of the held-out text (the same
    windows every time), its forward pass under TinyJit too."""
    rng = np.random.default_rng(1234)
    windows = [random_batch(data, batch, model.config.block_size, rng) for _ in range(batches)]

    @TinyJit
    def forward_loss(inputs: Tensor, targets: Tensor) -> Tensor:
        return model.loss(inputs, targets).realize()

    def held_out_loss() -> float:
        losses = [float(forward_loss(Tensor(x), Tensor(y)).item()) for x, y in windows]
        return float(np.mean(losses))
    return held_out_loss


def train(model: GPT, train_data: np.ndarray, valid_data: np.ndarray, steps: int, batch: int,
          max_lr: float, seed: int, eval_every: int) -> list[dict[str, float]]:
    """Train for `steps` steps; return the loss curve (one row per evaluation)."""
    optimizer = nn.optim.AdamW(get_parameters(model), lr=max_lr, b2=0.99, weight_decay=0.1)
    train_step = make_train_step(model, optimizer, max_norm=1.0)
    held_out_loss = make_held_out_loss(model, valid_data, batch)
    rng = np.random.default_rng(seed)
    curve: list[dict[str, float]] = []
    progress = tqdm(range(steps), desc="training", mininterval=1.0)
    start, recent = time.perf_counter(), []
    for step in progress:
        optimizer.lr.assign(Tensor(cosine_lr(step, max_lr, steps, warmup_steps=steps // 10,
                                             min_lr=max_lr / 10))).realize()
        inputs, targets = random_batch(train_data, batch, model.config.block_size, rng)
        loss, norm = train_step(Tensor(inputs), Tensor(targets))
        recent.append(float(loss.item()))
        progress.set_postfix(loss=f"{recent[-1]:.3f}", norm=f"{float(norm.item()):.2f}")
        if (step + 1) % eval_every == 0 or step == steps - 1:
            curve.append({"step": step + 1, "seconds": round(time.perf_counter() - start, 1),
                          "train": round(float(np.mean(recent)), 4),
                          "held_out": round(held_out_loss(), 4)})
            recent = []
            progress.write(f"step {step + 1}: train {curve[-1]['train']:.3f}, "
                           f"held-out {curve[-1]['held_out']:.3f}")
    return curve


def save(model: GPT, path: str) -> None:
    config = json.dumps(model.config.__dict__)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    safe_save(get_state_dict(model), path, metadata={"config": config})


def load(path: str) -> GPT:
    with open(path, "rb") as file:
        header_size = int.from_bytes(file.read(8), "little")
        header = json.loads(file.read(header_size))
    model = GPT(GPTConfig(**json.loads(header["__metadata__"]["config"])))
    load_state_dict(model, safe_load(path))
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=250)
    parser.add_argument("--device", default=None, help="CPU, NUMPY, OPENCL, ... (default: best)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--embed-size", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--save", default=str(default_checkpoint()), metavar="PATH",
                        help="checkpoint written after training ('' for none; default: "
                        "%(default)s)")
    parser.add_argument("--load", nargs="?", const=str(default_checkpoint()), default=None,
                        metavar="PATH", help="start from this checkpoint (no PATH: the default "
                        "one, which training saves)")
    parser.add_argument("--log", default=None, help="write the loss curve here as JSON")
    parser.add_argument("--prompt", default="Return the ")
    parser.add_argument("--sample-length", type=int, default=300)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top-k", type=int, default=20)
    arguments = parser.parse_args()
    if arguments.device:
        Device.DEFAULT = arguments.device
    Tensor.manual_seed(arguments.seed)
    tokenizer = CharTokenizer.printable()
    train_data, valid_data = load_corpus(tokenizer)
    if arguments.load and not Path(arguments.load).is_file():
        parser.error(f"no checkpoint at {arguments.load}: train one first (python "
                     "examples/gpt.py saves it there), or give --load PATH")
    if arguments.load:
        model = load(arguments.load)
    else:
        model = GPT(GPTConfig(tokenizer.vocab_size, arguments.block_size, arguments.embed_size,
                              arguments.layers, arguments.heads))
    print(f"corpus: {len(train_data):,} training and {len(valid_data):,} held-out characters; "
          f"model: {model.parameter_count():,} parameters on {Device.DEFAULT}")
    if arguments.steps > 0:
        curve = train(model, train_data, valid_data, arguments.steps, arguments.batch_size,
                      arguments.lr, arguments.seed, arguments.eval_every)
        print(f"{GlobalCounters.kernel_count:,} kernel launches so far")
        if arguments.log:
            with open(arguments.log, "w") as file:
                json.dump(curve, file, indent=1)
        if arguments.save:
            save(model, arguments.save)
            print(f"checkpoint: {arguments.save}")
    start = time.perf_counter()
    sampler = Sampler(model)
    new = sampler.generate(tokenizer.encode(arguments.prompt), arguments.sample_length,
                           arguments.temperature, arguments.top_k, arguments.seed)
    seconds = time.perf_counter() - start
    print(f"--- sample ({len(new)} tokens in {seconds:.1f} s, temperature "
          f"{arguments.temperature}, top-k {arguments.top_k}) ---")
    print(arguments.prompt + tokenizer.decode(new))
    captured = sampler.jitted_step.captured
    if captured is not None:
        symbolic = [launch.item.name for launch in captured.launches if launch.var_vals]
        print(f"generation: one TinyJit capture replayed for every position; "
              f"{len(symbolic)} of its {len(captured.launches)} kernels take start_pos as a "
              f"parameter (e.g. {symbolic[0] if symbolic else 'none'})")


if __name__ == "__main__":
    main()
