# %% [markdown] id="2a4d76c3"
# # viz: seeing every stage
#
# The visual layer draws what the stack does to `((a + b) * c).relu().sum(1)`: the lazy graph, the kernels it becomes and why, each kernel's AST, linear program and source, and the rewrite rules that tidied its index math. `%load_ext tinyteach` adds the `%%tinyteach` magic and rich display of tensors.

# %% id="1d7a261e"
# %load_ext tinyteach
import numpy as np

import viz
from tinyteach import Device, Tensor

Device.DEFAULT = "CPU"      # the book's outputs must not depend on which devices exist here
Tensor.manual_seed(0)       # random tensors: the same numbers on every run
rng = np.random.default_rng(0)
a, b, c = (Tensor(rng.standard_normal((4, 4)).astype(np.float32)) for _ in range(3))
out = ((a + b) * c).relu().sum(1)
out  # lazy: nothing has run yet

# %% [markdown] id="b6134412"
# ## The lazy graph
# Each node shows its op, shape and dtype; the colour is the kernel it will land in. Inputs are cylinders, constants dashed, stored results have a double border.

# %% id="35b1f205"
viz.graph(out)

# %% [markdown] id="25cc8b14"
# ## The schedule
# Softmax is one kernel: row fusion (chapter 6) computes each row's max and sum in the kernel that writes the
# row, while the row is in cache. Each cluster says what it fused.

# %% id="547fce33"
from tinyteach.helpers import Context

x = Tensor(np.arange(15, dtype=np.float32).reshape(3, 5))
assert viz.schedule(x.softmax(1)).text.startswith("schedule: 1 kernel")
viz.schedule(x.softmax(1))

# %% [markdown] id="b7e3a1f0"
# With `FUSE_ROWS=0` it is three kernels, and each arrow says why the value had to go through memory:

# %% id="c41d9e27"
with Context(FUSE_ROWS=0):
    unfused = viz.schedule(x.softmax(1))
assert unfused.text.startswith("schedule: 3 kernel")
unfused

# %% id="1af52c44"
viz.graph(x.softmax(1))

# %% [markdown] id="61108bf6"
# ## One kernel at every stage
# The AST, the linear program, and the source each renderer writes (no GPU is needed to *write* OpenCL, CUDA or WGSL).

# %% id="fd6cfe12"
viz.kernel(out)

# %% [markdown] id="f73f36cc"
# ## The rewrite rules that fired
# Move the slider (or click next) to step through them.

# %% id="1456da5f"
viz.rewrites(out)

# %% [markdown] id="43c98544"
# ## `%%tinyteach`: run a cell, see its kernels

# %% id="fa745ccf"
# %%tinyteach --show kernels,source,schedule
y = x.softmax(1)
y

# %% id="95db0098"
# %tinyteach --device NUMPY (Tensor([1.0, 2.0, 3.0]) * 2).sum()

# %% [markdown] id="1896a673"
# Once realized, a tensor shows a few values:

# %% id="c725d74f"
out.realize()
