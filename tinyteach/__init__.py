"""tinyteach: a book you can run — the tinygrad stack, rebuilt small enough to read.

Start with `from tinyteach import Tensor` and read the chapters in order. Each chapter is one
module (or small package) that opens with what it teaches, and one notebook in chapters/.

| #  | chapter                                              | module(s)                         |
|----|------------------------------------------------------|-----------------------------------|
| 0  | A tour: the whole stack from the top                 | —                                 |
| 1  | Tensors: a PyTorch-like API from 29 primitive ops    | tensor_core.py, tensor.py,        |
|    |                                                      | dtype.py, indexing.py,            |
|    |                                                      | tensor_create.py,                 |
|    |                                                      | tensor_movement.py,               |
|    |                                                      | tensor_math.py, tensor_nn.py      |
| 2  | Autograd: reverse mode on the graph                  | gradient.py                       |
| 3  | The IR: UOps and the primitive op set                | uop.py                            |
| 4  | Shapes without copies: views                         | view.py                           |
| 4b | Symbolic shapes: one kernel for every length         | (none); also uop.py, view.py      |
| 5  | Rewriting graphs: the pattern matcher                | rewrite.py                        |
| 6  | Scheduling: kernel fusion                            | schedule.py                       |
| 7  | Lowering and the optimization space:                 | lower.py, plan.py, opt.py,        |
|    | actions and BEAM                                     | search.py, pack.py                |
| 8  | Code generation: C, OpenCL, CUDA, WGSL               | render/, transcendental.py        |
| 8b | GPU kernels: threads, work-groups and shared memory  | runtime/python.py, wmma.py,       |
|    |                                                      | viz/threads.py;                   |
|    |                                                      | also lower.py, opt.py             |
| 8c | GPU puzzles: kernels graded by the emulator          | exercises/gpu_puzzles.py;         |
|    |                                                      | also runtime/python.py            |
| 9  | Devices and runtimes                                 | device.py, realize.py, runtime/,  |
|    |                                                      | multi.py                          |
| 10 | The JIT and graph execution                          | jit.py                            |
| 11 | Deep learning: nn, optim, state, datasets            | nn/                               |
| 11b| Attention and a small GPT                            | nn/transformer.py                 |
| 12 | Exercise: build a backend                            | exercises/                        |

This table is tinyteach/chapters.py's CHAPTERS (a test holds it, the README's map and each
module's first docstring line to that one table). A file beats its folder: runtime/ is chapter 9,
runtime/python.py 8b. helpers.py, settings.py (the settings of every chapter) and chapters.py
belong to no one chapter.

The data flow of `(a + b).relu().sum()`: tensor.py builds a lazy UOp graph -> schedule.py cuts
it into kernels -> lower.py turns each into loops -> render/ writes C -> runtime/cpu.py compiles
and runs it. Set DEBUG=1..5 (or `with Context(DEBUG=4):`) to watch every stage.

Layering: a module imports only from modules *below* it in this order (a test checks it):
settings, helpers, dtype, uop, view, rewrite, device, schedule, lower, render, runtime,
realize, gradient, the tensor layer, then jit, nn and exercises on top (settings.py lists every
setting and chapters.py, beside it, the chapters, both importing nothing; plan and opt sit with
lower: plan.py holds what lower reads, opt.py the actions that build it, above lower; pack and
search, which compile and run kernels, with realize).
The tensor layer is tensor_core (the core: graph, realize, primitive ops, autograd), the parts
on it in order (tensor_create, tensor_movement, tensor_math, tensor_nn) and indexing, with
tensor.py on top assembling them into Tensor; multi.py, the graphs of a tensor sharded over
several devices, sits below tensor_core, which holds one as a tensor's `uop`.
"""
from tinyteach import nn  # noqa: E402  # chapter 11 builds on everything above
from tinyteach.device import Device
from tinyteach.dtype import dtypes
from tinyteach.helpers import DEBUG, Context, GlobalCounters, clear_caches, getenv
from tinyteach.jit import TinyJit, function
from tinyteach.tensor import Tensor
from tinyteach.uop import UOp, Variable

__all__ = ["Tensor", "TinyJit", "dtypes", "Device", "Context", "DEBUG", "GlobalCounters", "nn",
           "getenv", "clear_caches", "Variable", "UOp", "function"]


def load_ipython_extension(ipython: object) -> None:
    """`%load_ext tinyteach`: the magics and rich display live in `viz`, imported only now
    (tinyteach itself never imports viz or IPython)."""
    from viz.magic import load_ipython_extension as load_viz

    load_viz(ipython)
