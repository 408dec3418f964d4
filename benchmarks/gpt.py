"""The GPT of examples/gpt.py timed against PyTorch (eager) and, where installed, tinygrad 0.14.

    python benchmarks/gpt.py                    # the example's model: 4 blocks of 128, context 64
    python benchmarks/gpt.py --quick            # fewer repetitions
    python benchmarks/gpt.py --embed-size 64 --layers 2

Two figures per framework, each the fastest of repeated runs after warm-up steps:
- a training step (forward, backward, gradient clipping, AdamW) on a batch of 16 x 64 tokens;
- a generation step per token: one token in, the next token's logits out, through a KV cache.

Both models start from the same weights and see the same batches; before timing, the script
checks that their first losses agree (a benchmark of two different computations would be
meaningless). tinyteach runs its TinyJit replays (and says how many kernels each replays);
PyTorch runs eager, its cache sliced to the current length (the usual way to write it there);
tinyteach's cache is sliced the same way, to a symbolic length (a bound Variable), so one JIT
capture serves every position. tinygrad is not a
dependency of tinyteach; when `import tinygrad` fails, its column says so.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
sys.modules.setdefault("triton", None)  # type: ignore[arg-type]  # see tests/conftest.py

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.impl_torch import TorchGPT, torch_name  # noqa: E402
from tinyteach import Device, Tensor, nn  # noqa: E402
from tinyteach.nn.state import get_parameters, get_state_dict  # noqa: E402
from tinyteach.nn.transformer import GPT, GPTConfig, Sampler  # noqa: E402


def torch_copy(model: GPT) -> TorchGPT:
    theirs = TorchGPT(model.config)
    state = {torch_name(k): torch.tensor(v.numpy()) for k, v in get_state_dict(model).items()}
    theirs.load_state_dict(state, strict=True)
    return theirs


# ---- the measurements ----

def best_seconds(run: Callable[[int], Any], warmup: int, repeats: int) -> float:
    """run(i) for i in 0..warmup+repeats-1; the fastest of the last `repeats` (on a shared
    machine a run that lost its core for a time slice measures the machine, not the code)."""
    times = []
    for index in range(warmup + repeats):
        start = time.perf_counter()
        run(index)
        times.append(time.perf_counter() - start)
    return min(times[warmup:])


def tinyteach_figures(model: GPT, batches: list[tuple[np.ndarray, np.ndarray]], warmup: int,
                      repeats: int) -> dict[str, float]:
    import gpt as example  # examples/gpt.py: its own TinyJit'd training step

    optimizer = nn.optim.AdamW(get_parameters(model), lr=1e-3, b2=0.99, weight_decay=0.1)
    train_step = example.make_train_step(model, optimizer, max_norm=1.0)
    first_loss: list[float] = []

    def train(index: int) -> None:
        inputs, targets = batches[index % len(batches)]
        loss, _ = train_step(Tensor(inputs), Tensor(targets))
        value = float(loss.item())  # waits for the step
        if not first_loss:
            first_loss.append(value)

    train_seconds = best_seconds(train, warmup, repeats)
    assert train_step.captured is not None
    sampler = Sampler(model)
    block = model.config.block_size

    def generate(index: int) -> None:
        sampler.logits(index % model.config.vocab_size, index % block)

    token_seconds = best_seconds(generate, warmup, max(repeats, block))
    assert sampler.jitted_step.captured is not None
    return {"train_ms": train_seconds * 1e3, "token_ms": token_seconds * 1e3,
            "train_kernels": len(train_step.captured.launches),
            "token_kernels": len(sampler.jitted_step.captured.launches),
            "first_loss": first_loss[0]}


def torch_figures(model: TorchGPT, batches: list[tuple[np.ndarray, np.ndarray]], warmup: int,
                  repeats: int) -> dict[str, float]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99),
                                  weight_decay=0.1)
    vocab, first_loss = model.config.vocab_size, []

    def train(index: int) -> None:
        inputs, targets = (torch.tensor(a, dtype=torch.long) for a in batches[index % len(batches)])
        optimizer.zero_grad()
        loss = F.cross_entropy(model(inputs).reshape(-1, vocab), targets.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if not first_loss:
            first_loss.append(loss.item())

    train_seconds = best_seconds(train, warmup, repeats)
    config = model.config
    shape = (1, config.heads, config.block_size, config.embed_size // config.heads)
    caches = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(config.layers)]

    def generate(index: int) -> None:
        with torch.no_grad():
            model.step(index % vocab, index % config.block_size, caches)

    token_seconds = best_seconds(generate, warmup, max(repeats, config.block_size))
    return {"train_ms": train_seconds * 1e3, "token_ms": token_seconds * 1e3,
            "first_loss": first_loss[0]}


def tinygrad_status() -> str:
    try:
        import tinygrad
    except ImportError:
        return "not installed (pip install tinygrad==0.14.0 to add its column)"
    return f"installed ({getattr(tinygrad, '__version__', '?')}), no GPT workload written yet"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--embed-size", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--torch-threads", type=int, default=None, help="PyTorch's intra-op "
                        "threads (default: PyTorch's own, every core, as a user runs it)")
    arguments = parser.parse_args()
    if arguments.torch_threads is not None:
        torch.set_num_threads(arguments.torch_threads)
    warmup, repeats = (3, 5) if arguments.quick else (3, 15)
    Device.DEFAULT = "CPU"
    torch.manual_seed(0)
    Tensor.manual_seed(0)
    config = GPTConfig(96, arguments.block_size, arguments.embed_size, arguments.layers,
                       arguments.heads)
    model = GPT(config)
    theirs = torch_copy(model)
    rng = np.random.default_rng(0)
    shape = (arguments.batch_size, config.block_size)
    batches = [(rng.integers(0, 96, shape).astype(np.int32),
                rng.integers(0, 96, shape).astype(np.int32)) for _ in range(4)]
    print(f"GPT: {model.parameter_count():,} parameters, batch {shape[0]} x {shape[1]} tokens, "
          f"torch {torch.__version__} with {torch.get_num_threads()} threads")
    ours = tinyteach_figures(model, batches, warmup, repeats)
    peer = torch_figures(theirs, batches, warmup, repeats)
    if not math.isclose(ours["first_loss"], peer["first_loss"], rel_tol=1e-4):
        raise SystemExit(f"the first losses differ: tinyteach {ours['first_loss']}, torch "
                         f"{peer['first_loss']}: the two models are not the same computation")
    print(f"first loss {ours['first_loss']:.4f} in both (ln 96 = {math.log(96):.4f})\n")
    print(f"{'':28}{'tinyteach CPU':>15}{'torch eager':>13}{'ratio':>8}   kernels (tinyteach)")
    for key, label, kernels in (("train_ms", "training step (ms)", "train_kernels"),
                                ("token_ms", "generation, per token (ms)", "token_kernels")):
        ratio = ours[key] / peer[key]
        print(f"{label:28}{ours[key]:>15.2f}{peer[key]:>13.2f}{ratio:>7.2f}x   "
              f"{int(ours[kernels])}")
    print(f"\ntinygrad 0.14: {tinygrad_status()}")


if __name__ == "__main__":
    main()
