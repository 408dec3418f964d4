# %% [markdown] id="dl-01"
# # Chapter 11 — Deep learning: nn, optim, state, datasets
#
# Everything so far — tensors, autograd, fusion, code generation, the JIT — comes together here
# in the way tinygrad users write models:
#
# - a **layer** is a plain Python object holding Tensors, with a `__call__`; there is no Module
#   base class. `nn.state.get_parameters(model)` finds the parameters by walking attributes;
# - an **optimizer** step is one more lazy graph: it builds every new parameter and `assign`s it,
#   so `step()` is a handful of kernels and a JIT captures it like any other function;
# - a **state dict** names every tensor by its path (`l1.weight`) and saves to safetensors;
# - **datasets**: `nn.datasets.digits()` gives scikit-learn's 8×8 digits offline.
#
# On the way we open one training step as the compiler sees it: what each of its kernels
# computes, why Adam costs three kernels per parameter, and where an arange hides in the loss;
# then the numerics behind the loss and behind float16 (log-softmax, mixed precision). At the
# end we train a small network on digits with `TinyJit`, plot its loss and check its test
# accuracy — in a few seconds, on a CPU.
#
# Modules: [`tinyteach/nn/__init__.py`](../tinyteach/nn/__init__.py) (layers),
# [`nn/optim.py`](../tinyteach/nn/optim.py), [`nn/state.py`](../tinyteach/nn/state.py),
# [`nn/datasets.py`](../tinyteach/nn/datasets.py); a script version of the training loop (with
# a CNN) is [`examples/train_digits.py`](../examples/train_digits.py).

# %% id="dl-02"
# %load_ext tinyteach
import numpy as np

import viz
from tinyteach import Device, GlobalCounters, Tensor

Device.DEFAULT = "CPU"   # every chapter runs on the CPU device: generated C, compiled here
Tensor.manual_seed(0)
rng = np.random.default_rng(0)

import matplotlib.pyplot as plt
from tqdm.notebook import tqdm

from tinyteach import TinyJit, nn
from tinyteach.nn.state import get_parameters, get_state_dict, load_state_dict

# %% [markdown] id="dl-03"
# ## Layers are objects that hold Tensors
#
# `nn.Linear(64, 32)` holds a weight (32, 64) and a bias (32,), drawn uniformly from
# ±1/√64 as PyTorch and tinygrad do. Calling it is `x @ weight.T + bias`:

# %% id="dl-04"
layer = nn.Linear(64, 32)
x = Tensor(rng.standard_normal((5, 64)).astype(np.float32))
print("weight", layer.weight.shape, "bias", layer.bias.shape, "->", layer(x).shape)
assert np.abs(layer.weight.numpy()).max() <= 1 / 8
np.testing.assert_allclose(layer(x).numpy(),
                           x.numpy() @ layer.weight.numpy().T + layer.bias.numpy(), rtol=1e-4,
                           atol=1e-5)


# %% [markdown] id="dl-05"
# A model is any object whose attributes (or lists, dicts) hold layers. A two-layer perceptron
# for 8×8 images:

# %% id="dl-06"
class MLP:
    def __init__(self, hidden: int = 64):
        self.l1 = nn.Linear(64, hidden)
        self.l2 = nn.Linear(hidden, 10)

    def __call__(self, images: Tensor) -> Tensor:
        return self.l2(self.l1(images.flatten(1)).relu())


Tensor.manual_seed(0)
model = MLP()
Tensor.realize(*get_parameters(model))  # draw the initial weights now
state = get_state_dict(model)
for name, tensor in state.items():
    print(f"{name:10} {tensor.shape}")
print(sum(t.numel() for t in get_parameters(model)), "parameters")

# %% [markdown] id="dl-07"
# ## Optimizers: a step is a lazy graph too
#
# `SGD`, `Adam`, `AdamW` and `LAMB` take the parameters and a learning rate. `zero_grad()` forgets
# old gradients, `backward()` builds the new ones, and `step()` realizes every updated parameter
# (and the optimizer's own state) together. The step runs in *training mode*
# (`with Tensor.train():`). Minimize `(w - 3)²` with SGD:

# %% id="dl-08"
w = Tensor([0.0])
sgd = nn.optim.SGD([w], lr=0.1)
with Tensor.train():
    for _ in range(20):
        sgd.zero_grad()
        ((w - 3) ** 2).sum().backward()
        sgd.step()
print(f"w after 20 steps: {w.item():.4f}")
assert abs(w.item() - 3) < 0.05

# %% [markdown] id="dl-37"
# ### What training mode changes
#
# Not the gradients: `backward()` builds the same gradients in either mode (chapter 2 calls it
# outside training mode). `Tensor.training` gates three things. `Optimizer.step()` refuses to run
# without it, so an evaluation loop cannot change the weights by mistake (tinygrad does the same).
# `dropout` zeroes values (and scales the rest by 1/(1−p)) only in training. `BatchNorm`
# normalizes with the batch's own mean and variance in training, and moves its running
# statistics towards them; outside training it normalizes with the running statistics:

# %% id="dl-38"
v = Tensor([2.0], requires_grad=True)
((v - 3) ** 2).sum().backward()                 # no Tensor.train(): the gradient is there
print("gradient outside training mode:", v.grad.item())
try:
    nn.optim.SGD([v], lr=0.1).step()
except RuntimeError as error:
    print("RuntimeError:", error)

ones = Tensor.ones(8)
print("dropout, evaluation:", ones.dropout(0.5).numpy())
with Tensor.train():
    print("dropout, training:  ", ones.dropout(0.5).numpy())

norm = nn.BatchNorm(1)                          # one channel; running mean 0, running var 1
batch = Tensor([[1.0], [3.0]])                  # two samples: mean 2, (biased) variance 1
print("batch norm, evaluation:", norm(batch).numpy().ravel().round(3))
with Tensor.train():
    print("batch norm, training:  ", norm(batch).numpy().ravel().round(3))
print("running mean after one training batch:", norm.running_mean.numpy().round(3))
assert v.grad.item() == -2.0 and norm.running_mean.numpy()[0] == np.float32(0.2)

# %% [markdown] id="dl-09"
# One Adam step on the model, seen through `%%tinyteach`: a whole forward, backward and update
# becomes a few dozen fused kernels. (Each time shown is a single launch's: a rough size, not a
# kernel's cost.)

# %% id="dl-10"
# %%tinyteach --show kernels
adam = nn.optim.Adam(get_parameters(model), lr=1e-2)
images = Tensor(rng.random((64, 1, 8, 8)).astype(np.float32), requires_grad=False)  # data
labels = Tensor(rng.integers(0, 10, 64).astype(np.int32))
with Tensor.train():
    adam.zero_grad()
    model(images).sparse_categorical_crossentropy(labels).backward()
    adam.step()

# %% [markdown] id="dl-40"
# ## A training step, kernel by kernel
#
# How many kernels is one step, and why that many? Without a JIT every call schedules the step
# afresh, so `record_launches()` (chapter 9) can watch one, and `GlobalCounters.kernel_count`
# counts the same launches. The first step is special: Adam's moments `m` and `v` start as
# zeros, and those zeros are computed the first time a step reads them (one kernel per shape:
# `m` and `v` start as the same lazy zeros).

# %% id="dl-41"
from tinyteach.engine.realize import record_launches


def one_step(model, optimizer, images: Tensor, labels: Tensor) -> Tensor:
    """Forward, loss, backward and update, without a JIT: every kernel is scheduled afresh."""
    with Tensor.train():
        optimizer.zero_grad()
        loss = model(images).sparse_categorical_crossentropy(labels).backward()
        optimizer.step()
    return loss


Tensor.manual_seed(3)
draw = np.random.default_rng(3)
probe_model = MLP()
probe_adam = nn.optim.Adam(get_parameters(probe_model), lr=1e-2)
# data, not parameters: requires_grad=False, or backward would compute the images' gradient
# too (tinyteach's rule, chapter 2: a tensor the backward reaches gets a .grad unless it says
# False)
probe_images = Tensor(draw.random((64, 1, 8, 8)).astype(np.float32),
                      requires_grad=False).realize()
probe_labels = Tensor(draw.integers(0, 10, 64).astype(np.int32)).realize()
Tensor.realize(*get_parameters(probe_model))
with record_launches() as first_launches:
    one_step(probe_model, probe_adam, probe_images, probe_labels)
GlobalCounters.reset()
with record_launches() as step_launches:
    one_step(probe_model, probe_adam, probe_images, probe_labels)
print(f"first step: {len(first_launches)} kernels; every later step: {len(step_launches)} "
      f"(GlobalCounters: {GlobalCounters.kernel_count})")
assert len(step_launches) == GlobalCounters.kernel_count
fresh = [launch.item for launch in first_launches
         if launch.item.boundary_reason == "contiguous() asks for a fresh buffer"]
print("only in the first step:", [item.name for item in fresh], "-", fresh[0].boundary_reason)
assert len(fresh) == len(first_launches) - len(step_launches)


# %% [markdown] id="dl-42"
# A kernel ends where the scheduler must store a value (chapter 6), so the count is a list
# of stored values. Thirteen of them are the forward pass, the loss and the backward pass, in
# the order they run:
#
# | kernel | what it stores |
# |---|---|
# | `r_64_64_64` | forward: images @ l1.weight.T (a sum of 64 products per output) |
# | `r_1_64` | loss: how many labels count (labels != ignore_index), the mean's divisor |
# | `r_10_10` | loss: arange(10), the class numbers the labels are compared with |
# | `r_64_10_64` | forward: relu(hidden + l1.bias) @ l2.weight.T |
# | `r_64_10` | forward: each image's largest logit (log_softmax subtracts it) |
# | `r_64_10` | forward: the sum of exp(logit - max) per image (log_softmax's denominator) |
# | `r_64_10_10` | backward: the gradient of the logits (softmax minus one-hot, over N), its per-image sum over classes computed in the same kernel (chapter 6) |
# | `r_64_64_10` | backward: the gradient of the hidden layer, d_logits @ l2.weight, through relu |
# | `r_64_64_64` | backward: the gradient of l1.weight, d_hidden.T @ images |
# | `r_64_64` | backward: the gradient of l1.bias, d_hidden summed over the batch |
# | `r_10_64_64` | backward: the gradient of l2.weight, d_logits.T @ relu(hidden) |
# | `r_10_64` | backward: the gradient of l2.bias, d_logits summed over the batch |
# | `r_1_64_10` | loss: the mean cross-entropy, computed before the update overwrites the weights it reads (the loss is still alive) |
#
# The others are the optimizer's: each writes a tensor the optimizer owns (`assign` writes
# into the tensor's own memory), so the memory a kernel writes says which update it is. The
# step's kernels in the order they run, each with the tensor it writes, or with the reason
# chapter 6's scheduler gives for storing a new buffer (the gradients and the loss are
# outputs: `backward()` and `step()` realize them). `tests/test_chapter11.py` holds the table
# above to what the scheduler makes:

# %% id="dl-43"
def memory_of(tensor: Tensor):
    """The memory a realized tensor's values live in (an assign writes into it)."""
    return tensor._buffer().storage


parameter_names = dict(zip(map(id, get_parameters(probe_model)), get_state_dict(probe_model)))
names = {id(memory_of(probe_adam.lr)): "lr", id(memory_of(probe_adam.betas)): "[b1, b2]",
         id(memory_of(probe_adam.beta_powers)): "[b1^t, b2^t]"}
for parameter, m, v in zip(probe_adam.params, probe_adam.m, probe_adam.v):
    name = parameter_names[id(parameter)]
    names[id(memory_of(m))] = f"m of {name}"
    names[id(memory_of(v))] = f"v of {name}"
    names[id(memory_of(parameter))] = name

updates = 0
for number, launch in enumerate(step_launches, start=1):
    written = names.get(id(launch.item.output.storage))
    updates += written is not None
    why = launch.item.boundary_reason.split(":")[0]  # chapter 6's reason for storing it
    print(f"{number:2}. {launch.item.name:11} " + (f"writes {written}" if written else
                                                    f"a new buffer, because {why}"))
print(f"{len(step_launches)} = {len(step_launches) - updates} forward/loss/backward kernels + "
      f"3 x {len(probe_adam.params)} parameters + 1 step counter")
assert updates == 3 * len(probe_adam.params) + 1

# %% [markdown] id="dl-44"
# ### Adam: three kernels per parameter
#
# Adam updates a parameter p with gradient g by three assigns:
# m ← b₁·m + (1−b₁)·g, then v ← b₂·v + (1−b₂)·g², then p ← p − lr·m̂ / (√v̂ + ε), where
# m̂ = m / (1−b₁ᵗ) and v̂ = v / (1−b₂ᵗ). `step()` realizes all three, and in this scheduler a
# kernel has exactly one output (its AST is one STORE, chapter 6; tinygrad can also build
# multi-output kernels). Three stored tensors are three kernels, and the parameter's kernel
# reads the two new moments back from memory. One more kernel advances the step counters
# [b₁ᵗ, b₂ᵗ] for all parameters: 3 × 4 + 1 = 13 of the step's kernels. The four that update
# `l1.weight` (each `boundary_reason` is "it is an output"):

# %% id="dl-45"
def name_of(buffer) -> str:
    """A named tensor's name, or the number of the kernel (in the list above) that wrote it."""
    if id(buffer.storage) in names:
        return names[id(buffer.storage)]
    writer = next(number for number, launch in enumerate(step_launches, start=1)
                  if launch.item.output.storage is buffer.storage)
    return f"kernel {writer}'s output"


first_update = next(k for k, launch in enumerate(step_launches)
                    if id(launch.item.output.storage) in names)
for launch in step_launches[first_update:first_update + 4]:
    item = launch.item
    reads = [name_of(buffer) for buffer in item.buffers[1:]]
    if any(buffer.storage is item.output.storage for buffer in item.old_contents_read):
        reads.insert(0, "its own old value")
    print(f"{item.name:8} writes {name_of(item.output):13} reads {', '.join(reads)}")
viz.schedule(step_launches[first_update:first_update + 4])

# %% [markdown] id="dl-46"
# ### The arange in every step
#
# `sparse_categorical_crossentropy` (in `tinyteach/tensor/nn.py`) picks each image's
# log-probability of its label with a one-hot mask, `Y.unsqueeze(-1) == arange(10)`. An arange
# needs no data from the host: a small `Tensor.arange` is a running sum of ones, minus one
# (`tensor/create.py`), and a running sum is a reduction. That is kernel 3, `r_10_10`: for each
# of 10 outputs, a sum over 10 padded ones. It stores 1, …, 10; the "− 1" and the comparison
# with the labels are fused into the two kernels that read it (CMPNE is the comparison). The
# same ten numbers are computed again in every step: they are a graph, not a constant.

# %% id="dl-47"
arange_launch = next(launch for launch in step_launches if launch.item.name == "r_10_10")
print(arange_launch.runner.source)
np.testing.assert_array_equal(arange_launch.item.output.numpy(), np.arange(1, 11))
readers = [launch.item for launch in step_launches
           if any(buffer.storage is arange_launch.item.output.storage
                  for buffer in launch.item.buffers[1:])]
for item in readers:
    print(f"{item.name:9} reads it;", next(f for f in item.fusions if "CMPNE" in f))
assert [item.name for item in readers] == ["r_64_10_10", "r_1_64_10"]

# %% [markdown] id="dl-48"
# The one-hot on its own, three labels against `arange(10)`: two kernels, the arange and a
# comparison. The compiler writes `label == arange` as `(label != sum − 1) != 1`:

# %% id="dl-49"
few_labels = Tensor(np.array([3, 0, 9], dtype=np.int32))
with record_launches() as one_hot_launches:
    one_hot = (few_labels.unsqueeze(-1) == Tensor.arange(10)).realize()
for launch in one_hot_launches:
    print(launch.runner.source)
np.testing.assert_array_equal(one_hot.numpy(), np.eye(10, dtype=bool)[[3, 0, 9]])
assert [launch.item.name for launch in one_hot_launches] == ["r_10_10", "E_3_10"]

# %% [markdown] id="dl-11"
# ## State dicts: names, saving, loading
#
# `get_state_dict` names tensors by their path; `safe_save` writes the safetensors format (a
# JSON header, then raw bytes — nothing is unpickled on load); `load_state_dict` checks every
# name and shape before assigning. Copy the model's weights into a fresh one:

# %% id="dl-12"
import tempfile
from pathlib import Path

from tinyteach.nn.state import safe_load, safe_save

with tempfile.TemporaryDirectory() as directory:
    path = Path(directory) / "mlp.safetensors"
    safe_save(get_state_dict(model), path)
    loaded = safe_load(path)
copy = MLP()
load_state_dict(copy, loaded)
probe = Tensor(rng.random((3, 1, 8, 8)).astype(np.float32))
np.testing.assert_allclose(copy(probe).numpy(), model(probe).numpy(), rtol=1e-6)
print("loaded", sorted(loaded), "- the copy computes the same outputs")

# %% [markdown] id="dl-13"
# A wrong shape is reported by name, before anything is overwritten:

# %% id="dl-14"
try:
    load_state_dict(MLP(hidden=32), loaded)
except Exception as error:
    print(type(error).__name__ + ":", error)

# %% [markdown] id="dl-15"
# ## The data: 8×8 digits, offline
#
# `nn.datasets.digits()` returns the 1,797 images bundled with scikit-learn, scaled to [0, 1],
# with a fixed split: the images in a fixed shuffled order, 1,500 for training and 297 for
# testing.

# %% id="dl-16"
X_train, Y_train, X_test, Y_test = nn.datasets.digits()
print(X_train.shape, X_train.dtype, Y_train.shape, Y_train.dtype, X_test.shape)
x_train, y_train = X_train.numpy(), Y_train.numpy()
x_test, y_test = X_test.numpy(), Y_test.numpy()
assert x_train.shape == (1500, 1, 8, 8) and 0 <= x_train.min() and x_train.max() <= 1

figure, axes = plt.subplots(1, 8, figsize=(8, 1.3))
for axis, image, label in zip(axes, x_train[:8], y_train[:8]):
    axis.imshow(image[0], cmap="gray_r")
    axis.set_title(int(label))
    axis.axis("off")
plt.show()

# %% [markdown] id="dl-17"
# ## Training with `TinyJit`
#
# The step — forward, loss, backward, Adam update — is captured on its second call and replayed
# afterwards (chapter 10). Batches are drawn on the host with a seeded numpy generator and
# passed in as arguments, so each replay sees new data. The progress bar is tqdm's notebook
# widget; the numbers we keep are printed at the end.

# %% id="dl-18"
Tensor.manual_seed(1)  # another seed than the model above: a fresh set of weights
batches = np.random.default_rng(0)
model = MLP(hidden=64)
optimizer = nn.optim.Adam(get_parameters(model), lr=1e-2)


@TinyJit
def train_step(images: Tensor, labels: Tensor) -> Tensor:
    with Tensor.train():
        optimizer.zero_grad()
        loss = model(images).sparse_categorical_crossentropy(labels).backward()
        optimizer.step()
        return loss.realize()


STEPS, BATCH = 300, 64
losses = []
progress = tqdm(range(STEPS), desc="training")
for step in progress:
    chosen = batches.integers(0, len(x_train), BATCH)
    loss = train_step(Tensor(x_train[chosen], requires_grad=False), Tensor(y_train[chosen]))
    losses.append(loss.item())
    if step % 50 == 0:
        progress.set_postfix(loss=f"{losses[-1]:.3f}")
print(f"{STEPS} steps; loss {np.mean(losses[:20]):.3f} (first 20) -> "
      f"{np.mean(losses[-20:]):.3f} (last 20); {len(train_step.captured.launches)} kernels "
      "per step")
assert np.mean(losses[-20:]) < 0.3 * np.mean(losses[:20])
assert np.mean(losses[-20:]) < 0.2
assert len(train_step.captured.launches) == len(step_launches)  # the JIT replays the same kernels

# %% id="dl-19"
plt.figure(figsize=(6, 3))
plt.plot(losses, alpha=0.4, label="per step")
smooth = np.convolve(losses, np.ones(20) / 20, mode="valid")
plt.plot(np.arange(19, STEPS), smooth, label="mean of 20")
plt.xlabel("step")
plt.ylabel("cross-entropy")
plt.yscale("log")
plt.legend()
plt.show()

# %% [markdown] id="dl-20"
# ## Test accuracy
#
# Evaluation is a plain forward pass on the 297 held-out images, outside `Tensor.train()`. This
# model has neither dropout nor batch norm, so the mode changes nothing in its forward pass; what
# it guarantees is that nothing steps. (No gradients are built either, but that is because
# evaluation never calls `backward()`.)

# %% id="dl-21"
predictions = model(Tensor(x_test)).argmax(axis=1).numpy()
accuracy = (predictions == y_test).mean()
print(f"test accuracy: {accuracy:.1%}")
assert accuracy > 0.85

# %% [markdown] id="dl-22"
# Which digits does it confuse? The first eight test images with the model's guesses, and below
# them the test images it gets wrong (in red: its guess, then the true label):

# %% id="dl-23"
wrong = np.flatnonzero(predictions != y_test)[:8]
print("misclassified (true -> predicted):",
      [f"{int(y_test[i])}->{int(predictions[i])}" for i in wrong])
figure, axes = plt.subplots(2, 8, figsize=(8, 2.4))
for row, indices in zip(axes, (np.arange(8), wrong)):
    for axis in row:
        axis.axis("off")
    for axis, i in zip(row, indices):
        axis.imshow(x_test[i, 0], cmap="gray_r")
        right = predictions[i] == y_test[i]
        title = f"guess {predictions[i]}" if right else f"{predictions[i]}, not {y_test[i]}"
        axis.set_title(title, fontsize=9, color="black" if right else "red")
plt.show()

# %% [markdown] id="dl-50"
# ## Numerics: log_softmax, not log(softmax)
#
# Cross-entropy needs log-probabilities. Computed as written, log(exp(x) / Σ exp(x)) overflows
# for a logit of 1000: exp(1000) is inf in float32, and inf / inf is NaN. `softmax` subtracts
# each row's max first, so it cannot overflow, but its tiny probabilities underflow to 0 and
# their log is −inf where the true values are −1000 and −2000. `log_softmax` subtracts the max
# and stays in log space, (x − max) − log Σ exp(x − max): every term is finite. Checked against
# PyTorch in float64 (the second row has small logits, where all three agree):

# %% id="dl-51"
import torch

logits = np.array([[1000.0, 0.0, -1000.0], [1.0, 2.0, 3.0]], dtype=np.float32)
x = Tensor(logits)
naive = (x.exp() / x.exp().sum(-1, keepdim=True)).log().numpy()
softmax_then_log = x.softmax(-1).log().numpy()
stable = x.log_softmax(-1).numpy()
reference = torch.log_softmax(torch.tensor(logits, dtype=torch.float64), -1).numpy()
print("log(exp(x) / sum exp(x)):", naive[0])
print("log(softmax(x)):         ", softmax_then_log[0])
print("log_softmax(x):          ", stable[0])
print("torch, float64:          ", reference[0])
assert np.isnan(naive[0, 0]) and np.isneginf(softmax_then_log[0, 2])
np.testing.assert_allclose(stable, reference, rtol=1e-6)
np.testing.assert_allclose(naive[1], reference[1], rtol=1e-6)  # small logits: all agree
np.testing.assert_allclose(softmax_then_log[1], reference[1], rtol=1e-6)

# %% [markdown] id="dl-52"
# ## Mixed precision: store in float16, add in float32
#
# float16 has 11 significant bits: from 1024 up its spacing is 1, so adding a product below 0.5
# to a sum that large changes nothing. A matmul of length 4096 over values in [0, 1) grows its
# sums to about 1000; accumulated in float16 it would lose whole units. So tinyteach, like
# tinygrad (`sum_acc_dtype`) and PyTorch, keeps float16 and bfloat16 tensors in their dtype
# (half the memory and the bandwidth) but adds them in float32 and rounds once at the end: the
# kernel of `a @ b` declares a `float` accumulator and casts the result back to `_Float16`.
# Below, the same float16 inputs summed in float16 (a numpy loop that rounds after every
# add), and tinyteach's matmul on CPU, each compared with float64 products; tinyteach's result
# agrees with PyTorch's to within one float16 step:

# %% id="dl-53"

values = np.random.default_rng(4)
a = values.random((16, 4096)).astype(np.float16)
b = values.random((4096, 16)).astype(np.float16)
exact = a.astype(np.float64) @ b.astype(np.float64)  # the same float16 inputs, in float64


def relative_error(result: np.ndarray) -> float:
    return float(np.abs(result.astype(np.float64) - exact).max() / exact.max())


in_half = np.zeros((16, 16), np.float16)
for k in range(a.shape[1]):                      # float16 += float16: rounded after every add
    in_half += a[:, k:k + 1] * b[k:k + 1, :]
with record_launches() as launches:
    ours = (Tensor(a) @ Tensor(b)).numpy()     # on CPU
accumulator = [line.strip() for line in launches[-1].runner.source.splitlines()
               if "acc0" in line]
print(f"summed in float16 (numpy loop):  relative error {relative_error(in_half):.0e}")
print(f"tinyteach a @ b, {ours.dtype}:     relative error {relative_error(ours):.0e}")
print("its kernel:", accumulator[0], "...", accumulator[-1])
print(f"float16 spacing at 1024: {np.spacing(np.float16(1024))}; "
      f"1024 + 0.4 in float16 = {np.float16(1024) + np.float16(0.4)}")
assert relative_error(in_half) > 1e-2 and relative_error(ours) < 1e-3
assert accumulator[0] == "float acc0 = 0.0f;" and "_Float16" in accumulator[-1]
theirs = (torch.tensor(a) @ torch.tensor(b)).numpy()  # a different float32 order may round
np.testing.assert_allclose(ours, theirs, rtol=2 ** -10)  # ... to the next float16, no further


# %% [markdown] id="dl-24"
# ## Try it

# %% [markdown] id="dl-25"
# **Try it — SGD with momentum.** Train a fresh `MLP` for 100 steps with `nn.optim.SGD(..., lr=0.1, momentum=0.9)` instead of
# Adam (reuse the loop above, without the progress bar). How does its test accuracy compare?

# %% id="dl-26"
# your code here

# %% [markdown] id="dl-27"
# *Solution* (click the collapsed cell below to show it):

# %% id="dl-28" jupyter={"source_hidden": true} tags=["solution"]
def train(make_optimizer, steps=100, seed=2):
    Tensor.manual_seed(seed)
    draw = np.random.default_rng(seed)
    net = MLP()
    opt = make_optimizer(get_parameters(net))

    @TinyJit
    def step_fn(images, labels):
        with Tensor.train():
            opt.zero_grad()
            loss = net(images).sparse_categorical_crossentropy(labels).backward()
            opt.step()
            return loss.realize()

    for _ in range(steps):
        chosen = draw.integers(0, len(x_train), BATCH)
        step_fn(Tensor(x_train[chosen], requires_grad=False), Tensor(y_train[chosen]))
    return (net(Tensor(x_test)).argmax(axis=1).numpy() == y_test).mean()

sgd_accuracy = train(lambda params: nn.optim.SGD(params, lr=0.1, momentum=0.9))
print(f"SGD with momentum, 100 steps: {sgd_accuracy:.1%}")
assert sgd_accuracy > 0.6

# %% [markdown] id="dl-29"
# **Try it — how many kernels per step?** The JIT replays `len(train_step.captured.launches)` kernels per step. Draw the captured
# schedule with `viz.schedule(...)` and find the kernel of the first layer's matmul.

# %% id="dl-30"
# your code here

# %% [markdown] id="dl-31"
# *Solution* (click the collapsed cell below to show it):

# %% id="dl-32" jupyter={"source_hidden": true} tags=["solution"]
names = [launch.item.name for launch in train_step.captured.launches]
print(len(names), "kernels;", [n for n in names if n.startswith("r_64_64")])
viz.schedule(train_step.captured.launches[:6])

# %% [markdown] id="dl-33"
# **Try it — save the trained model.** Save the trained `model` with `safe_save`, load it into a new `MLP`, and check that it has
# the same test accuracy.

# %% id="dl-34"
# your code here

# %% [markdown] id="dl-35"
# *Solution* (click the collapsed cell below to show it):

# %% id="dl-36" jupyter={"source_hidden": true} tags=["solution"]
with tempfile.TemporaryDirectory() as directory:
    path = Path(directory) / "trained.safetensors"
    safe_save(get_state_dict(model), path)
    restored = MLP()
    load_state_dict(restored, safe_load(path))
restored_accuracy = (restored(Tensor(x_test)).argmax(axis=1).numpy() == y_test).mean()
print(f"restored model: {restored_accuracy:.1%}")
assert restored_accuracy == accuracy
