# %% [markdown] id="tour-01"
# # Chapter 0 — A tour: the whole stack from the top
#
# This book rebuilds [tinygrad](https://github.com/tinygrad/tinygrad) in small, readable
# Python, and every chapter is a notebook you run. This first one runs a tiny neural network
# and follows it down through every layer of the stack, without explaining much yet: each
# layer gets its own chapter later.
#
# **What you will see**
# - a Tensor expression builds a *lazy graph*; nothing is computed until you ask for a value;
# - when you ask, the graph is cut into a few *kernels*, each kernel is turned into C, compiled
#   and run — and `with Context(DEBUG=4):` prints every step;
# - `%%tinyteach` shows the same information inline, cell by cell.
#
# The package's chapter map lives in [`tinyteach/__init__.py`](../tinyteach/__init__.py).

# %% id="tour-02"
import numpy as np

from tinyteach import Context, Device, GlobalCounters, Tensor

Device.DEFAULT = "CPU"      # the book's outputs must not depend on which devices exist here
Tensor.manual_seed(0)       # random tensors: the same numbers on every run
rng = np.random.default_rng(0)
# %load_ext tinyteach
import viz  # drawings: viz.graph, viz.schedule, viz.kernel, viz.rewrites

# %% [markdown] id="tour-03"
# ## The seed example: a two-layer network
#
# Four fake 28×28 grey images, a hidden layer of 128 units with ReLU, and 10 outputs — the
# shape of an MNIST classifier. `kaiming_uniform` (He initialization) draws weights uniformly
# in about ±√(6 / fan-in), so that a ReLU layer keeps the size of its inputs; the *fan-in* is the
# number of inputs each output sums over. Which axis is that? `kaiming_uniform`, like
# tinygrad's and PyTorch's, follows the layout of `nn.Linear`'s weight, `(out_features,
# in_features)`, and takes the fan-in from `shape[1:]`. So the weights are drawn as (128, 784)
# and (10, 128) and transposed for `x.dot(w)`. Written `kaiming_uniform(784, 128)`, the fan-in
# would be 128 and the first layer √(784/128) ≈ 2.5× too large (the loss below shows the cost).

# %% id="tour-04"
x = Tensor(rng.standard_normal((4, 1, 28, 28)).astype(np.float32))
w1 = Tensor.kaiming_uniform(128, 784).T   # (out, in), fan-in 784; transposed to (784, 128)
w2 = Tensor.kaiming_uniform(10, 128).T    # (out, in), fan-in 128; transposed to (128, 10)
Tensor.realize(x, w1, w2)   # compute the inputs now, so that below we see only the network

out = x.flatten(1).dot(w1).relu().dot(w2)
out

# %% [markdown] id="tour-05"
# `out` is *lazy*: it knows its shape and dtype, but no arithmetic has run. Under the hood it
# is a graph of `UOp` nodes (chapter 3), built from only 29 primitive operations (plus a few
# bookkeeping nodes such as `DETACH`, which compute nothing; chapter 1):

# %% id="tour-06"
GlobalCounters.reset()
print(f"{len(out.uop.toposort)} nodes in the graph, "
      f"{GlobalCounters.kernel_count} kernels run so far")
print(sorted({node.op.name for node in out.uop.toposort}))

# %% [markdown] id="tour-07"
# ## Drawing the graph
#
# `viz.graph` draws the lazy graph of a tensor without running anything. Each box is a node (chains
# of movement ops are folded into one box); the colour says which kernel it will be computed
# in; cylinders are buffers already in memory.

# %% id="tour-08"
viz.graph(out)

# %% [markdown] id="tour-09"
# ## Asking for the value, with `DEBUG=4`
#
# `.numpy()` realizes the tensor. With `DEBUG=4` the stack prints, for every kernel: why the
# scheduler cut the graph there and what it fused (chapter 6), the kernel's AST — a small UOp
# graph (chapter 3) —, the optimizations applied (chapter 7), the generated C (chapter 8), and
# the launch line with its buffers and time (chapter 9).

# %% id="tour-10"
with Context(DEBUG=4):
    result = out.numpy()

# %% [markdown] id="tour-11"
# Two kernels for two matrix products: the ReLU was *fused* into the second product (it reads
# the first product's result and applies `max(x, 0)` on the fly). Notice how each matmul became
# a sum over a product: `dot` is built from `RESHAPE`, `EXPAND`, `MUL` and `REDUCE_AXIS` —
# there is no matmul primitive.
#
# Every result in this book is checked. numpy computes the same network:

# %% id="tour-12"
expected = np.maximum(x.numpy().reshape(4, -1) @ w1.numpy(), 0) @ w2.numpy()
assert np.allclose(result, expected, atol=1e-4)
result.round(3)

# %% [markdown] id="tour-13"
# ## `%%tinyteach`: the same story, inline
#
# The first cell loaded the notebook extension (`%load_ext tinyteach`), which also shows
# tensors as small tables. `%%tinyteach` runs a cell, realizes its value if it
# is lazy, and shows every kernel that ran: why it exists, what it fused and its source. Its times are those of
# each single launch in this run: a rough size, not a kernel's cost (one launch is noisy; chapter 7
# shows how to measure). Here
# the cell trains one step's worth of gradients: a loss, then `backward()` (chapter 2).

# %% id="tour-14"
# %%tinyteach --show kernels
w1.requires_grad = w2.requires_grad = True
labels = Tensor([3, 1, 4, 1])
loss = x.flatten(1).dot(w1).relu().dot(w2).sparse_categorical_crossentropy(labels)
loss.backward()
Tensor.realize(loss, w1.grad, w2.grad)

# %% [markdown] id="tour-15"
# Check the loss against numpy (log-softmax, then the mean of the picked entries) and the
# gradient of the last layer (`hiddenᵀ · (softmax − one_hot) / batch`):

# %% id="tour-16"
hidden = np.maximum(x.numpy().reshape(4, -1) @ w1.numpy(), 0)
logits = hidden @ w2.numpy()
log_probs = logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1,
                            keepdims=True)) - logits.max(1, keepdims=True)
picked = log_probs[np.arange(4), [3, 1, 4, 1]]
assert np.isclose(loss.item(), -picked.mean(), rtol=1e-4)

one_hot = np.eye(10)[[3, 1, 4, 1]]
expected_grad = hidden.T @ (np.exp(log_probs) - one_hot) / 4
assert np.allclose(w2.grad.numpy(), expected_grad, atol=1e-4)
round(loss.item(), 4)

# %% [markdown] id="tour-25"
# Is 3.1 a sensible loss for a network that has learnt nothing? A classifier that spreads its
# bets evenly over 10 classes scores ln 10 ≈ 2.30. He initialization gives the logits a spread
# (standard deviation) σ of about 1.1 rather than 0, and random logits of spread σ cost more:
# the loss is the log of the mean of e^z over the classes, minus the picked class's z, which is
# about ln 10 + σ²/2 ≈ 2.9 for σ = 1.1 (the mean of e^z is e^(σ²/2) for normal z). With the fan-in
# taken from the wrong axis, both layers are too large (by √(784/128) ≈ 2.5 and √(128/10) ≈ 3.6),
# the logits come out about 11× too large, and the softmax is confidently wrong:

# %% id="tour-26"
wrong1, wrong2 = Tensor.kaiming_uniform(784, 128), Tensor.kaiming_uniform(128, 10)
wrong_logits = x.flatten(1).dot(wrong1).relu().dot(wrong2)
wrong_loss = wrong_logits.sparse_categorical_crossentropy(labels).item()
print(f"ln 10 = {np.log(10):.2f}")
print(f"loss {loss.item():.2f}, logits' std {logits.std():.1f}: fan-in 784 and 128; "
      f"ln 10 + std²/2 = {np.log(10) + logits.std() ** 2 / 2:.2f}")
print(f"loss {wrong_loss:.2f}, logits' std {wrong_logits.numpy().std():.1f}: "
      "kaiming_uniform(784, 128), fan-in 128 and 10")
assert loss.item() < 4 < 10 < wrong_loss
assert abs(loss.item() - (np.log(10) + logits.std() ** 2 / 2)) < 0.25  # 4 images: roughly

# %% [markdown] id="tour-17"
# ## The map of the book
#
# | # | chapter | notebook | module |
# |---|---|---|---|
# | 0 | A tour (this notebook) | [00_tour](00_tour.ipynb) | [`__init__.py`](../tinyteach/__init__.py) |
# | 1 | Tensors: an API from 29 primitive ops | [01_tensors](01_tensors.ipynb) | [`tensor/`](../tinyteach/tensor/) (the parts of Tensor), [`dtype.py`](../tinyteach/dtype.py) |
# | 2 | Autograd: reverse mode on the graph | [02_autograd](02_autograd.ipynb) | [`tensor/gradient.py`](../tinyteach/tensor/gradient.py) |
# | 3 | The IR: UOps and the primitive op set | [03_ir](03_ir.ipynb) | [`ir/uop.py`](../tinyteach/ir/uop.py) |
# | 4 | Shapes without copies: views | [04_views](04_views.ipynb) | [`ir/view.py`](../tinyteach/ir/view.py) |
# | 4b | Symbolic shapes: one kernel for every length | [04b_symbolic](04b_symbolic.ipynb) | (reads [`ir/uop.py`](../tinyteach/ir/uop.py) and [`ir/view.py`](../tinyteach/ir/view.py) again) |
# | 5 | Rewriting graphs: the pattern matcher | [05_rewrite](05_rewrite.ipynb) | [`ir/rewrite.py`](../tinyteach/ir/rewrite.py) |
# | 6 | Scheduling: kernel fusion | [06_scheduling](06_scheduling.ipynb) | [`engine/schedule.py`](../tinyteach/engine/schedule.py) |
# | 7 | Lowering and the optimization space: actions and BEAM | [07_lowering](07_lowering.ipynb) | [`codegen/lower.py`](../tinyteach/codegen/lower.py), [`codegen/plan.py`](../tinyteach/codegen/plan.py), [`opt/`](../tinyteach/opt/) (the actions, the heuristic, BEAM, packing) |
# | 8 | Code generation: C, OpenCL, CUDA, WGSL | [08_codegen](08_codegen.ipynb) | [`render/`](../tinyteach/render/), [`codegen/transcendental.py`](../tinyteach/codegen/transcendental.py) |
# | 8b | GPU kernels: threads, work-groups and shared memory | [08b_gpu](08b_gpu.ipynb) | [`codegen/lower_gpu.py`](../tinyteach/codegen/lower_gpu.py), [`codegen/wmma.py`](../tinyteach/codegen/wmma.py), [`runtime/python.py`](../tinyteach/runtime/python.py) (the emulator), [`viz/threads.py`](../viz/threads.py) |
# | 8c | GPU puzzles: kernels you write, graded by the emulator | [08c_gpu_puzzles](08c_gpu_puzzles.ipynb) | [`exercises/gpu_puzzles.py`](../tinyteach/exercises/gpu_puzzles.py) |
# | 9 | Devices and runtimes | [09_devices](09_devices.ipynb) | [`device.py`](../tinyteach/device.py), [`engine/realize.py`](../tinyteach/engine/realize.py), [`runtime/`](../tinyteach/runtime/), [`tensor/multi.py`](../tinyteach/tensor/multi.py) |
# | 10 | The JIT and graph execution | [10_jit](10_jit.ipynb) | [`engine/jit.py`](../tinyteach/engine/jit.py) |
# | 11 | Deep learning: nn, optim, datasets | [11_deep_learning](11_deep_learning.ipynb) | [`nn/`](../tinyteach/nn/) |
# | 11b | Attention and a small GPT | [11b_gpt](11b_gpt.ipynb) | [`nn/transformer.py`](../tinyteach/nn/transformer.py) |
#
# The last chapter is an exercise: build a backend's primitive ops yourself
# ([12_exercise_backend](12_exercise_backend.ipynb)). In the course that `make course` opens,
# it and the GPU puzzles (8c) are student copies, with every solution taken out; the solved
# notebooks stay in `chapters/`, for instructors and the tests.
#
# The visual layer used above is the [`viz`](../viz/__init__.py) package; it only reads what the
# core exposes, and the core never imports it.

# %% [markdown] id="tour-18"
# ## Try it
#
# 1. Run the forward pass with a batch of 16 images instead of 4. How many kernels run, and do
#    their names change? (`GlobalCounters.kernel_count` counts launches.)
# 2. Run the same network on the `NUMPY` device — the reference interpreter, which runs the
#    graph with numpy instead of compiled C — and check it gives the same numbers.
# 3. Which `DEBUG` level shows the fusion reasons but not the C source? Try it on
#    `(x * 2).sum()`.

# %% [markdown] id="tour-19"
# #### Solution (click to show): exercise 1

# %% id="tour-20" jupyter={"source_hidden": true}
batch = Tensor(rng.standard_normal((16, 1, 28, 28)).astype(np.float32)).realize()
GlobalCounters.reset()
with Context(DEBUG=1):
    bigger = batch.flatten(1).dot(w1.detach()).relu().dot(w2.detach()).numpy()
print(GlobalCounters.kernel_count, "kernels; shape", bigger.shape)

# %% [markdown] id="tour-21"
# #### Solution (click to show): exercise 2

# %% id="tour-22" jupyter={"source_hidden": true}
x_np, w1_np, w2_np = (t.detach().to("NUMPY") for t in (x, w1, w2))
on_numpy = x_np.flatten(1).dot(w1_np).relu().dot(w2_np)
assert on_numpy.device == "NUMPY"
assert np.allclose(on_numpy.numpy(), result, atol=1e-4)

# %% [markdown] id="tour-23"
# #### Solution (click to show): exercise 3

# %% id="tour-24" jupyter={"source_hidden": true}
# DEBUG=3: reasons, fusions and the AST; 4 adds the source
with Context(DEBUG=3):
    (x * 2).sum().numpy()
