# %% [markdown] id="sched-01"
# # Chapter 6 — Scheduling: kernel fusion
#
# Up to now a Tensor expression has been a lazy graph of UOps. This chapter answers the question
# *how many programs does the machine actually run, and why that many?*
#
# - a **kernel** reads some buffers and writes one; everything computed in between stays in
#   registers. Memory traffic is what costs, so the scheduler fuses as much as it can.
#   (One output per kernel is *this* scheduler's choice, not a law: tinygrad can write several
#   outputs from one kernel. It is why an Adam step here costs 3 kernels per parameter — the
#   parameter, and the optimizer's two moments.);
# - elementwise ops fuse — into the input of a reduction, onto its output, and with each
#   other — unless a stated reason stores them: `contiguous()`, `assign()`, a copy to another
#   device, a result broadcast 16 times or more into a reduction, a result read through 64
#   different views or more, or a chain of 1,000 ops;
# - a reduction is stored in its own buffer only for a stated reason: its result is broadcast
#   back over the axes it reduced, it feeds another reduction, it is padded, or several kernels
#   need it;
# - ... except a chain of reductions over the same short rows (softmax, layernorm): each row's
#   reductions are computed in the one kernel that reads them, once per row, while the row is
#   still in cache;
# - every cut and every fusion is written down in plain words, so you can ask *why*.
#
# The chapter's module is [`tinyteach/engine/schedule.py`](../tinyteach/engine/schedule.py) (`create_schedule`,
# `ScheduleItem`); the drawings come from [`viz/schedule.py`](../viz/schedule.py) and
# [`viz/graph.py`](../viz/graph.py).

# %% id="sched-02"
# %load_ext tinyteach
import numpy as np

import viz
from tinyteach import Context, Device, GlobalCounters, Tensor

Device.DEFAULT = "CPU"   # every chapter runs on the CPU device: generated C, compiled here
Tensor.manual_seed(0)
rng = np.random.default_rng(0)

from tinyteach.engine.schedule import create_schedule


def schedule_of(*tensors):
    """The kernels realizing `tensors` would run (nothing runs)."""
    items, _ = create_schedule([t.uop for t in tensors], "CPU")
    return items


def random_tensor(*shape):
    return Tensor(rng.standard_normal(shape).astype(np.float32)).realize()


# %% [markdown] id="sched-03"
# ## One expression, one kernel
#
# Start with three realized 4×4 inputs and the chapter's running example,
# `((a + b) * c).relu().sum(1)`: an add, a multiply, a relu and a sum over rows. Naively that is
# four loops with three temporary arrays. `create_schedule` cuts the graph into kernels:

# %% id="sched-04"
a, b, c = random_tensor(4, 4), random_tensor(4, 4), random_tensor(4, 4)
out = ((a + b) * c).relu().sum(1)
items = schedule_of(out)
print([item.name for item in items])
assert len(items) == 1

# %% [markdown] id="sched-05"
# One kernel, named as tinygrad names them: `r_` for a kernel with a reduction, then the sizes
# (4 output rows, 4 summed columns). Each `ScheduleItem` carries the reason its result is stored
# and a list of what it fused:

# %% id="sched-06"
item = items[0]
print("stored because:", item.boundary_reason)
for note in item.fusions + item.input_reasons:
    print(" -", note)
assert "ADD" in item.fusions[1] and "MUL" in item.fusions[1]

# %% [markdown] id="sched-07"
# The relu appears as comparisons, `OR` and `WHERE`: `relu` is `where(x < 0, 0, x)` in
# primitive ops, which keeps a NaN as PyTorch does (tinygrad's `where(0 < x, x, 0)` maps it to
# 0, and a diverging run would hide its NaNs), with an inner `where` that passes exact zeros
# through `DETACH`, so that the gradient at 0 is 0. The broadcast of the sum's shape is just
# `RESHAPE`/`EXPAND` — index arithmetic, not a copy. The same information, drawn: one cluster per kernel, its fusions inside, its inputs as
# cylinders.

# %% id="sched-08"
viz.schedule(out)

# %% [markdown] id="sched-09"
# Scheduling plans; realizing runs. `GlobalCounters` counts every launch, so we can check that
# the plan is what happens — and that the fused kernel computes what numpy computes:

# %% id="sched-10"
GlobalCounters.reset()
result = out.numpy()
print("kernels launched:", GlobalCounters.kernel_count)
assert GlobalCounters.kernel_count == 1
expected = np.maximum((a.numpy() + b.numpy()) * c.numpy(), 0).sum(1)
np.testing.assert_allclose(result, expected, rtol=1e-5)

# %% [markdown] id="sched-11"
# ## A matmul is one kernel too
#
# `a @ b` is built from primitives as *reshape, broadcast, multiply, sum*: `a` becomes
# (4, 4, 1) → broadcast (4, 4, 4), `b` is transposed and broadcast the other way, and the product
# is summed over the last axis. The broadcasts never exist in memory: they are index math, and the
# multiply fuses into the sum's input.

# %% id="sched-12"
matmul = schedule_of(a @ b)
print([i.name for i in matmul])
for note in matmul[0].fusions:
    print(" -", note)
assert len(matmul) == 1 and matmul[0].name == "r_4_4_4"

# %% [markdown] id="sched-13"
# ## Softmax: three kernels by the first rule — and each cut has a reason
#
# `softmax(x) = exp(x - max(x)) / sum(exp(x - max(x)))` along a row. There are two reductions,
# and both results are *broadcast back* over the row they reduced: every element needs its row's
# max, then its row's sum. The first rule of this scheduler: **a reduction whose result is
# broadcast back is stored.** Its kernels compute one output element (or a small tile of them)
# per iteration of their loops — one per thread on a GPU — and fused into such a kernel, each
# element would recompute its row's whole reduction. So each reduction goes to a small buffer.
# (The max is needed by two kernels — the sum and the division — and that is the first reason
# the scheduler finds.) `FUSE_ROWS=0` switches the next section's rule off, which gives this
# one back:

# %% id="sched-14"
with Context(FUSE_ROWS=0):
    softmax_items = schedule_of(a.softmax(1))
for number, item in enumerate(softmax_items, 1):
    print(f"kernel {number}: {item.name:6} stored because {item.boundary_reason}")
assert len(softmax_items) == 3
assert "broadcast back" in softmax_items[1].boundary_reason

# %% [markdown] id="sched-15"
# The arrows in the drawing are labelled with the reason the value had to go through memory:

# %% id="sched-16"
with Context(FUSE_ROWS=0):
    drawing = viz.schedule(a.softmax(1))
drawing

# %% [markdown] id="sched-17"
# In the lazy graph, each node is coloured by the kernel it lands in. The subtraction
# `x - max` is needed by kernel 2 (for the sum) *and* by kernel 3 (for the division): it is
# drawn striped, because the scheduler recomputes cheap elementwise work rather than storing it.

# %% id="sched-18"
with Context(FUSE_ROWS=0):
    drawing = viz.graph(a.softmax(1))
drawing

# %% [markdown] id="sched-47"
# Storing is the right rule when a row is long. Each of the three kernels reads the whole input
# from memory, and a row of a million floats would come from memory again on each pass of a
# single kernel too; the stored max and sum are small (one float per row). It is also the
# right rule on a GPU kernel where every output element is its own thread: there, a reduction
# placed in the output's kernel would be computed again by every thread of the row.
#
# ## One kernel per row, while the row is in cache
#
# On the CPU a kernel's output loops *are* loops, and a short row fits in the core's cache.
# Then a kernel can do what a hand-written softmax does, per row: one pass for the max, one
# for the sum of exps, one for the outputs. The first pass brings the row into cache; the
# others read it from there. The scheduler's second rule (`fuses_along_rows` in engine/schedule.py):
# **a chain of reductions over the same rows stays in the one kernel that reads it** when
#
# - the row is at most `MAX_FUSED_ROW_BYTES` = 32 KiB (8,192 float32s: L1 and L2 hold it),
# - the reduced axes are the innermost ones (softmax over the last axis; over the first axis,
#   each column's max would sit inside the loop over rows),
# - the device can compute a row's reductions once per row (`fuses_rows_on`): on CPU and NUMPY
#   the output loops are loops; a GPU with work-groups (OPENCL, WEBGPU, PYTHON, CUDA) gives each
#   row a work-group whose threads share the reductions (chapter 8b's group reductions), for
#   rows of at most `MAX_GROUP_ROW` = 2,048 elements,
# - between the reduction and the kernel's output there are only elementwise ops, broadcasts
#   back over the row and reductions over the same row.
#
# It is on by default (`FUSE_ROWS=1`). Softmax is now one kernel, and its fusions say why:

# %% id="sched-48"
(fused_softmax,) = schedule_of(a.softmax(1))
print(fused_softmax.name, "stored because", fused_softmax.boundary_reason)
for note in fused_softmax.fusions:
    print(" -", note)
assert sum("once per row" in note for note in fused_softmax.fusions) == 2

# %% [markdown] id="sched-49"
# Kernel counts before (`FUSE_ROWS=0`) and after, counted from the launches, with the values
# checked against numpy:

# %% id="sched-50"
rows = random_tensor(64, 256)
x_np = rows.numpy()
shifted = x_np - x_np.max(1, keepdims=True)
centered = x_np - x_np.mean(1, keepdims=True)
expected = {
    "softmax": np.exp(shifted) / np.exp(shifted).sum(1, keepdims=True),
    "log_softmax": shifted - np.log(np.exp(shifted).sum(1, keepdims=True)),
    "layernorm": centered / np.sqrt((centered ** 2).mean(1, keepdims=True) + 1e-5),
}
for name, values in expected.items():
    counts = []
    for fuse_rows in (0, 1):
        with Context(FUSE_ROWS=fuse_rows):
            GlobalCounters.reset()
            result = getattr(rows, name)(1).numpy()
            counts.append(GlobalCounters.kernel_count)
        np.testing.assert_allclose(result, values, rtol=1e-4, atol=1e-5)
    print(f"{name:12} kernels: {counts[0]} -> {counts[1]}")
    assert counts == [3, 1]

# %% [markdown] id="sched-51"
# "Once per row" is the lowering's job (chapter 7): inside the loops over rows and columns, the
# max depends on the row only, so `linearize` places it — and the sum, and `1/sum` — after the
# row loop opens and before the column loop. Here are the loops of the kernel's C source for a
# 4,096 × 1,024 softmax, with the optimizer's choices still applied (one row per iteration,
# the rows split across cores, each reduction's loop in blocks of SIMD lanes — chapter 8; the
# loops that combine the lanes at the end are left out). A column loop around the reductions
# would make the work grow with the square of the row:

# %% id="sched-52"
import re

from tinyteach.codegen.lower import lower
from tinyteach.opt.heuristic import heuristic_plan

big = Tensor.empty(4096, 1024)
(big_softmax,) = schedule_of(big.softmax(1))
renderer = Device["CPU"].renderer
plan = heuristic_plan(big_softmax.ast, renderer.vector_width)
source = renderer.render(big_softmax.name, lower(big_softmax.ast, plan))
loop_lines = [line for line in source.splitlines()
              if re.match(r"\s*(for|#pragma omp parallel)", line) and "_half" not in line]
print("\n".join(line.split(") for")[0] + ")" if ") for" in line else line
                for line in loop_lines))
assert [re.search(r"int (\w+)", line).group(1) for line in loop_lines[1:]] == \
    ["gidx0", "ridx0_block", "ridx1_block", "gidx1"]
assert loop_lines[0].strip() == "#pragma omp parallel for"
assert "gidx0 < 4096;" in loop_lines[1]   # 4,096 rows, one per iteration

# %% [markdown] id="sched-53"
# Memory traffic, as the engine counts it (`GlobalCounters.global_mem`, the bytes of every
# buffer a kernel reads or writes): the three kernels read the 1 MiB input three times; the
# fused kernel reads it once and writes the output. The limits, checked: a row of 8,193 floats
# is three kernels on the CPU; on the PYTHON device (a GPU emulator) a row of 2,048 is one
# kernel, a work-group per row, and a row of 2,049 is three.

# %% id="sched-54"
big = random_tensor(1024, 256)
traffic = []
for fuse_rows in (0, 1):
    with Context(FUSE_ROWS=fuse_rows):
        GlobalCounters.reset()
        big.softmax(1).realize()
        traffic.append(GlobalCounters.global_mem)
print(f"bytes moved: {traffic[0]:,} (3 kernels) -> {traffic[1]:,} (1 kernel)")
input_bytes = 1024 * 256 * 4
assert traffic[1] == 2 * input_bytes and traffic[0] >= 4 * input_bytes

long_rows = Tensor.empty(2, 8193)
print("CPU, a row of 8,193 floats:", len(schedule_of(long_rows.softmax(1))), "kernels")
assert len(schedule_of(long_rows.softmax(1))) == 3
for length, kernels in ((2048, 1), (2049, 3)):
    on_gpu = Tensor.empty(4, length, device="PYTHON")
    gpu_items, _ = create_schedule([on_gpu.softmax(1).uop], "PYTHON")
    print(f"PYTHON, a row of {length:,}:", [item.name for item in gpu_items])
    assert len(gpu_items) == kernels

# %% [markdown] id="sched-19"
# ## Every reason, one at a time
#
# `find_realized` in engine/schedule.py decides which nodes get a buffer of their own. Its complete list
# of reasons:
#
# | node | stored because |
# |---|---|
# | any | it is an output: `realize()` asked for it |
# | `CONTIGUOUS` | `contiguous()` asks for a fresh buffer |
# | `ASSIGN` | `assign()` writes the value into the tensor's own buffer (and, if the value reads its own target through a view, the value is computed into a fresh buffer first) |
# | `COPY` | a copy between devices is its own step (and its source is stored first unless it already is a buffer) |
# | a reduction | its result is broadcast back (`EXPAND`); it feeds another reduction; it is padded; it is used by several kernels |
# | — | *not* stored (broadcast back or feeding another reduction) when its rows fuse: at most 32 KiB (`MAX_FUSED_ROW_BYTES`), the innermost axes, output loops that are loops, only elementwise ops, broadcasts and reductions over the same rows above it (`FUSE_ROWS=0` turns it off) |
# | elementwise | it is broadcast 16× or more into a reduction (`BROADCAST_RECOMPUTE_LIMIT`), has 16 elements or more, and takes two ALU ops or more to compute; or 8× or more when it takes 12 ALU ops or more (`MIN_BROADCAST_COPIES`, `COSTLY_OPS`: a max-pool's gradient read by a 3×3 convolution's 9 taps) |
# | any ALU op | it is read through 64 different views or more within the kernels above it (`MAX_VIEWS_PER_NODE`): each view would compute it again, and views of views multiply |
# | any ALU op | the chain of ops is 1,000 deep (`MAX_KERNEL_DEPTH`): cut so the source stays small |
#
# Each case below is the smallest expression that triggers it.

# %% id="sched-20"
m = random_tensor(16, 16)
many_views = Tensor(np.arange(8, dtype=np.float32)).realize() + 1
for _ in range(6):  # each step reads the one before through two views: 2**6 = 64 views
    many_views = many_views.pad(((1, 0),)).shrink(((0, 8),)) + many_views.flip(0)
cases = {
    "broadcast back": a - a.mean(0, keepdim=True),   # (over rows, not the innermost axis)
    "reduction of a reduction": a.sum(1).max(),
    "padded reduction": a.sum(1).pad(((1, 1),)) + 1,
    "elementwise, broadcast into a matmul": (m + 1).exp() @ m,
    "contiguous": ((a + b).contiguous() * c).sum(1),
    "copy": (a + b).to("NUMPY"),
    "read through 64 views": many_views,
}
for name, tensor in cases.items():
    items = schedule_of(tensor)
    print(f"{name}: {len(items)} kernels; the first is stored because {items[0].boundary_reason}")
    assert len(items) == 2

# %% [markdown] id="sched-21"
# The last reduction reason needs *two outputs*. Realize `s + 1` and `s * 2` together (both read
# the same sum `s`): storing `s` once is cheaper than summing twice.

# %% id="sched-22"
s = a.sum(1)
shared = schedule_of(s + 1, s * 2)
for item in shared:
    print(f"{item.name}: {item.boundary_reason}")
assert len(shared) == 3 and "used by 2 kernels" in shared[0].boundary_reason

# %% [markdown] id="sched-23"
# Elementwise work is the opposite: unless one of the reasons above applies, it is *recomputed* in
# every kernel that needs it. Two sums of the same `exp` read the input twice, but nothing is
# stored in between:

# %% id="sched-24"
e = (a * 2).exp()
both = schedule_of(e.sum(0), e.sum(1))
print([item.name for item in both])
assert len(both) == 2 and all("EXP2" in " ".join(item.fusions) for item in both)

# %% [markdown] id="sched-43"
# ## Assign: writing into a buffer others still read
#
# `w.assign(value)` writes `value` into `w`'s own buffer instead of a fresh one (an optimizer
# step does this for every parameter). That creates an ordering rule the data flow alone does not
# give: every kernel that reads the buffer's *old* contents must run before the assign overwrites
# it. `order_items` adds those edges (`ScheduleItem.old_contents_read`), so the order below is
# the same whichever output is listed first. (The assign reads the old `w` too, but each element
# just before it overwrites that same element, which is safe.) If the assigned value itself reads its target
# through a view (`w.assign(w.T)`), writing in place would overwrite elements still to be read:
# the value is computed into a fresh buffer first. (When no order works at all, the next
# section shows what the scheduler does.)

# %% id="sched-44"
w = random_tensor(4, 4)
old, w_buffer = w.numpy(), w.uop.src[0].arg   # w is RESHAPE(BUFFER)
doubled_sum = (w * 2).sum(1)     # reads w's old contents
w.assign(w + 1)                  # lazy: will write into w's buffer
for item in schedule_of(w, doubled_sum):   # the assign is listed first, and still runs last
    reads_old = any(buffer is w_buffer for buffer in item.old_contents_read)
    role = "the assign" if item.node.op.name == "ASSIGN" else "the sum"
    print(f"{item.name} ({role}): reads the old w: {reads_old}")
Tensor.realize(w, doubled_sum)
np.testing.assert_allclose(doubled_sum.numpy(), (old * 2).sum(1), rtol=1e-6)
np.testing.assert_allclose(w.numpy(), old + 1, rtol=1e-6)

v = random_tensor(4, 4)
v_old = v.numpy()
v.assign(v.T + 1)
for item in schedule_of(v):
    print(f"{item.name}: {item.boundary_reason}")
v.realize()
np.testing.assert_allclose(v.numpy(), v_old.T + 1, rtol=1e-6)

# %% [markdown] id="sched-45"
# ### When no order works: copy the old value
#
# Train both `x` and `W` of `loss = (x @ W).sum()` with SGD (tinygrad's quickstart does). The
# gradient of `x` is built from the old `W`, the gradient of `W` from the old `x`, and each
# assign's kernel computes its gradient itself. So the assign into `x` must wait until the assign
# into `W` has read the old `x`, and the assign into `W` must wait for the assign into `x`: a
# knot, and no order of the two kernels is right. The scheduler cuts it by copying the *old*
# contents of one of the buffers into a fresh buffer first. Every kernel that wanted the old
# value reads the copy, so the assign into that buffer waits for nobody. One copy, one kernel
# more, the same numbers as PyTorch (a kernel that reads both the old and the new value of a
# buffer is the same knot, cut the same way).

# %% id="sched-46"
from tinyteach.nn.optim import SGD

x, W = random_tensor(2, 3), random_tensor(3, 3)
x_start, W_start = x.numpy(), W.numpy()
optimizer = SGD([x, W], lr=0.1)
with Tensor.train():
    optimizer.zero_grad()
    (x @ W).sum().backward()
    updated = optimizer.schedule_step()   # the assigns, lazily (step() = this, then realize)
    for item in schedule_of(*updated):
        role = "assign" if item.node.op.name == "ASSIGN" else "kernel"
        print(f"{item.name} ({role}): {item.boundary_reason}")
    Tensor.realize(*updated)

# the same step by hand: d(sum(x @ W))/dx = ones @ W.T, and /dW = x.T @ ones
ones = np.ones((2, 3), dtype=np.float32)
np.testing.assert_allclose(x.numpy(), x_start - 0.1 * ones @ W_start.T, rtol=1e-5)
np.testing.assert_allclose(W.numpy(), W_start - 0.1 * x_start.T @ ones, rtol=1e-5)

# %% [markdown] id="sched-25"
# ## `DEBUG=3` says the same thing
#
# The engine prints each kernel's reason, its fusions and its AST before running it — the AST is
# `SINK(STORE(DEFINE_GLOBAL 0, value))`, with the inputs as `DEFINE_GLOBAL 1, 2, ...`
# (the launch line's time is the one measured when this notebook was stored; yours will differ,
# and validation compares it as `TIME`).

# %% id="sched-26"
with Context(DEBUG=3):
    (a + b).sum(1).realize()

# %% [markdown] id="sched-27"
# ## `%%tinyteach`: run a cell, see its kernels
#
# The magic records every launch in the cell and shows the kernels with their fusion reasons.
# Layer norm without the scale: two reductions, each broadcast back — one kernel, both
# computed once per row.

# %% id="sched-28"
# %%tinyteach --show kernels,schedule
x = random_tensor(8, 16)
centered = x - x.mean(1, keepdim=True)
normalized = centered / (centered * centered).mean(1, keepdim=True).add(1e-5).sqrt()
normalized.realize()

# %% id="sched-29"
assert np.allclose(normalized.numpy().mean(1), 0, atol=1e-5)

# %% [markdown] id="sched-30"
# ## Try it

# %% [markdown] id="sched-31"
# **Try it — fuse onto a matmul.** Predict how many kernels `(a @ b).relu() + c` takes, then check with `schedule_of`.

# %% id="sched-32"
# your code here

# %% [markdown] id="sched-33"
# *Solution* (click the collapsed cell below to show it):

# %% id="sched-34" jupyter={"source_hidden": true} tags=["solution"]
items = schedule_of((a @ b).relu() + c)
print(len(items), items[0].fusions[-2])
assert len(items) == 1  # relu and + c fuse onto the reduction's output

# %% [markdown] id="sched-35"
# **Try it — force a cut.** `.contiguous()` asks for a fresh buffer. Use it to make `a + b` its own kernel in
# `((a + b) * c).sum(1)`, and print the reason the scheduler gives.

# %% id="sched-36"
# your code here

# %% [markdown] id="sched-37"
# *Solution* (click the collapsed cell below to show it):

# %% id="sched-38" jupyter={"source_hidden": true} tags=["solution"]
items = schedule_of(((a + b).contiguous() * c).sum(1))
print([(item.name, item.boundary_reason) for item in items])
assert len(items) == 2 and "contiguous" in items[0].boundary_reason

# %% [markdown] id="sched-39"
# **Try it — count a log-softmax.** How many kernels does `a.log_softmax(1)` take, and what is each one stored for? Check your
# answer with `GlobalCounters.kernel_count` after realizing it.

# %% id="sched-40"
# your code here

# %% [markdown] id="sched-41"
# *Solution* (click the collapsed cell below to show it):

# %% id="sched-42" jupyter={"source_hidden": true} tags=["solution"]
items = schedule_of(a.log_softmax(1))
for item in items:
    print(item.name, "-", item.boundary_reason)
GlobalCounters.reset()
a.log_softmax(1).realize()
assert GlobalCounters.kernel_count == len(items)
