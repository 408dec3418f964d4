# ruff: noqa: E402, E501, E701, I001, UP006, UP035, B007  (tinygrad's code, kept as written)
# The code of tinygrad's docs/mnist.md (the MNIST tutorial), block after block, with only the
# imports changed (the lines marked "tinyteach:"): tinyteach for tinygrad, and the offline
# digits in MNIST's format for nn.datasets.mnist. The prose between the blocks is left out.
# Run: python examples/mnist_tutorial.py   (7000 steps, as the tutorial: a long run on a CPU)
from tinyteach import Device  # tinyteach: was tinygrad
print(Device.DEFAULT)

from tinyteach import Tensor, nn  # tinyteach: was tinygrad

class Model:
  def __init__(self):
    self.l1 = nn.Conv2d(1, 32, kernel_size=(3,3))
    self.l2 = nn.Conv2d(32, 64, kernel_size=(3,3))
    self.l3 = nn.Linear(1600, 10)

  def __call__(self, x:Tensor) -> Tensor:
    x = self.l1(x).relu().max_pool2d((2,2))
    x = self.l2(x).relu().max_pool2d((2,2))
    return self.l3(x.flatten(1).dropout(0.5))

from tinyteach.nn.datasets import digits_mnist as mnist  # tinyteach: offline digits
X_train, Y_train, X_test, Y_test = mnist()
print(X_train.shape, X_train.dtype, Y_train.shape, Y_train.dtype)
# (60000, 1, 28, 28) dtypes.uchar (60000,) dtypes.uchar

model = Model()
acc = (model(X_test).argmax(axis=1) == Y_test).mean()
# NOTE: tinygrad is lazy, and hasn't actually run anything by this point
print(acc.item())  # ~10% accuracy, as expected from a random model

optim = nn.optim.Adam(nn.state.get_parameters(model))
batch_size = 128
def step():
  Tensor.training = True  # makes dropout work
  samples = Tensor.randint(batch_size, high=X_train.shape[0])
  X, Y = X_train[samples], Y_train[samples]
  optim.zero_grad()
  loss = model(X).sparse_categorical_crossentropy(Y).backward()
  optim.step()
  return loss

import timeit
timeit.repeat(step, repeat=5, number=1)

from tinyteach import GlobalCounters, Context  # tinyteach: was tinygrad
GlobalCounters.reset()
with Context(DEBUG=2): step()

from tinyteach import TinyJit  # tinyteach: was tinygrad
jit_step = TinyJit(step)

import timeit
timeit.repeat(jit_step, repeat=5, number=1)

for step in range(7000):
  loss = jit_step()
  if step%100 == 0:
    Tensor.training = False
    acc = (model(X_test).argmax(axis=1) == Y_test).mean().item()
    print(f"step {step:4d}, loss {loss.item():.2f}, acc {acc*100.:.2f}%")
