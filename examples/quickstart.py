# ruff: noqa: E402, E501, E701, I001, UP006, UP035, B007  (tinygrad's code, kept as written)
# The code of tinygrad's docs/quickstart.md, block after block, with only the imports changed
# (the lines marked "tinyteach:"): tinyteach for tinygrad, the offline digits in MNIST's
# format for extra.datasets' MNIST, and tinyteach.helpers for tinygrad.helpers; and the saved
# model's path. The prose between the blocks is left out.
# Run: python examples/quickstart.py   (it trains for 1000 steps and writes model.safetensors
# into tinyteach's cache folder, ~/.cache/tinyteach/quickstart, not the current one)
import numpy as np
from tinyteach.helpers import Timing  # tinyteach: was tinygrad.helpers

from tinyteach import Tensor  # tinyteach: was tinygrad

t1 = Tensor([1, 2, 3, 4, 5])
na = np.array([1, 2, 3, 4, 5])
t2 = Tensor(na)

full = Tensor.full(shape=(2, 3), fill_value=5) # create a tensor of shape (2, 3) filled with 5
zeros = Tensor.zeros(2, 3) # create a tensor of shape (2, 3) filled with 0
ones = Tensor.ones(2, 3) # create a tensor of shape (2, 3) filled with 1

full_like = Tensor.full_like(full, fill_value=2) # create a tensor of the same shape as `full` filled with 2
zeros_like = Tensor.zeros_like(full) # create a tensor of the same shape as `full` filled with 0
ones_like = Tensor.ones_like(full) # create a tensor of the same shape as `full` filled with 1

eye = Tensor.eye(3) # create a 3x3 identity matrix
arange = Tensor.arange(start=0, stop=10, step=1) # create a tensor of shape (10,) filled with values from 0 to 9

rand = Tensor.rand(2, 3) # create a tensor of shape (2, 3) filled with random values from a uniform distribution
randn = Tensor.randn(2, 3) # create a tensor of shape (2, 3) filled with random values from a standard normal distribution
uniform = Tensor.uniform(2, 3, low=0, high=10) # create a tensor of shape (2, 3) filled with random values from a uniform distribution between 0 and 10

from tinyteach import dtypes  # tinyteach: was tinygrad

t3 = Tensor([1, 2, 3, 4, 5], dtype=dtypes.int32)

t4 = Tensor([1, 2, 3, 4, 5])
t5 = (t4 + 1) * 2
t6 = (t5 * t4).relu().log_softmax()

print(t6.numpy())
# [-56. -48. -36. -20.   0.]

class Linear:
  def __init__(self, in_features, out_features, bias=True, initialization: str='kaiming_uniform'):
    self.weight = getattr(Tensor, initialization)(out_features, in_features)
    self.bias = Tensor.zeros(out_features) if bias else None

  def __call__(self, x):
    return x.linear(self.weight.transpose(), self.bias)

class TinyNet:
  def __init__(self):
    self.l1 = Linear(784, 128, bias=False)
    self.l2 = Linear(128, 10, bias=False)

  def __call__(self, x):
    x = self.l1(x)
    x = x.leakyrelu()
    x = self.l2(x)
    return x

net = TinyNet()

def sparse_categorical_crossentropy(self, Y, ignore_index=-1) -> Tensor:
    loss_mask = Y != ignore_index
    y_counter = Tensor.arange(self.shape[-1], dtype=dtypes.int32, requires_grad=False, device=self.device).unsqueeze(0).expand(Y.numel(), self.shape[-1])
    y = ((y_counter == Y.flatten().reshape(-1, 1)).where(-1.0, 0) * loss_mask.reshape(-1, 1)).reshape(*Y.shape, self.shape[-1])
    return self.log_softmax().mul(y).sum() / loss_mask.sum()

from tinyteach.nn.optim import SGD  # tinyteach: was tinygrad.nn.optim

opt = SGD([net.l1.weight, net.l2.weight], lr=3e-4)

from tinyteach.nn.datasets import fetch_digits_mnist as fetch_mnist  # tinyteach: offline digits

X_train, Y_train, X_test, Y_test = fetch_mnist()

with Tensor.train():
  for step in range(1000):
    # random sample a batch
    samp = np.random.randint(0, X_train.shape[0], size=(64))
    batch = Tensor(X_train[samp], requires_grad=False)
    # get the corresponding labels
    labels = Tensor(Y_train[samp])

    # forward pass
    out = net(batch)

    # compute loss
    loss = sparse_categorical_crossentropy(out, labels)

    # zero gradients
    opt.zero_grad()

    # backward pass
    loss.backward()

    # update parameters
    opt.step()

    # calculate accuracy
    pred = out.argmax(axis=-1)
    acc = (pred == labels).mean()

    if step % 100 == 0:
      print(f"Step {step+1} | Loss: {loss.numpy()} | Accuracy: {acc.numpy()}")

with Timing("Time: "):
  avg_acc = 0
  for step in range(1000):
    # random sample a batch
    samp = np.random.randint(0, X_test.shape[0], size=(64))
    batch = Tensor(X_test[samp], requires_grad=False)
    # get the corresponding labels
    labels = Y_test[samp]

    # forward pass
    out = net(batch)

    # calculate accuracy
    pred = out.argmax(axis=-1).numpy()
    avg_acc += (pred == labels).mean()
  print(f"Test Accuracy: {avg_acc / 1000}")

from tinyteach import TinyJit  # tinyteach: was tinygrad

@TinyJit
def jit(x):
  return net(x).realize()

with Timing("Time: "):
  avg_acc = 0
  for step in range(1000):
    # random sample a batch
    samp = np.random.randint(0, X_test.shape[0], size=(64))
    batch = Tensor(X_test[samp], requires_grad=False)
    # get the corresponding labels
    labels = Y_test[samp]

    # forward pass with jit
    out = jit(batch)

    # calculate accuracy
    pred = out.argmax(axis=-1).numpy()
    avg_acc += (pred == labels).mean()
  print(f"Test Accuracy: {avg_acc / 1000}")

from tinyteach.nn.state import safe_save, safe_load, get_state_dict, load_state_dict  # tinyteach: was tinygrad.nn.state

# first we need the state dict of our model
state_dict = get_state_dict(net)

# then we can just save it to a file
from tinyteach.helpers import cache_dir  # tinyteach: the file goes to tinyteach's cache folder
checkpoint = cache_dir("quickstart") / "model.safetensors"  # tinyteach: was "model.safetensors"
checkpoint.parent.mkdir(parents=True, exist_ok=True)  # tinyteach: (not the current folder)
safe_save(state_dict, str(checkpoint))  # tinyteach: was "model.safetensors"

# and load it back in
state_dict = safe_load(str(checkpoint))  # tinyteach: was "model.safetensors"
load_state_dict(net, state_dict)
