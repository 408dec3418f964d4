"""tinyteach: a book you can run — the tinygrad stack, rebuilt small enough to read.

Start with `from tinyteach import Tensor` and read the chapters in order. Each chapter is one
module (or small package) that opens with what it teaches, and one notebook in chapters/.

| #  | chapter                                              | module(s)                         |
|----|------------------------------------------------------|-----------------------------------|
| 0  | A tour: the whole stack from the top                 | —                                 |
| 1  | Tensors: a PyTorch-like API from 29 primitive ops    | tensor/, dtype.py                 |
| 2  | Autograd: reverse mode on the graph                  | tensor/gradient.py                |
| 3  | The IR: UOps and the primitive op set                | ir/uop.py                         |
| 4  | Shapes without copies: views                         | ir/view.py                        |
| 4b | Symbolic shapes: one kernel for every length         | (none); also ir/uop.py, ir/view.py |
| 5  | Rewriting graphs: the pattern matcher                | ir/rewrite.py                     |
| 6  | Scheduling: kernel fusion                            | engine/schedule.py                |
| 7  | Lowering and the optimization space:                 | codegen/lower.py, codegen/plan.py, |
|    | actions and BEAM                                     | opt/                              |
| 8  | Code generation: C, OpenCL, CUDA, WGSL               | render/,                          |
|    |                                                      | codegen/transcendental.py         |
| 8b | GPU kernels: threads, work-groups and shared memory  | codegen/lower_gpu.py,             |
|    |                                                      | codegen/wmma.py,                  |
|    |                                                      | runtime/python.py, viz/threads.py; |
|    |                                                      | also opt/                         |
| 8c | GPU puzzles: kernels graded by the emulator          | exercises/gpu_puzzles.py;         |
|    |                                                      | also runtime/python.py            |
| 9  | Devices and runtimes                                 | device.py, engine/realize.py,     |
|    |                                                      | runtime/, tensor/multi.py         |
| 10 | The JIT and graph execution                          | engine/jit.py                     |
| 11 | Deep learning: nn, optim, state, datasets            | nn/                               |
| 11b| Attention and a small GPT                            | nn/transformer.py                 |
| 12 | Exercise: build a backend                            | exercises/                        |

This table is tinyteach/chapters.py's CHAPTERS (a test holds it, the README's map and each
module's first docstring line to that one table). A file beats its folder: runtime/ is chapter 9,
runtime/python.py 8b; tensor/ is chapter 1, tensor/gradient.py 2. helpers.py, settings.py (the
settings of every chapter), chapters.py and the folder guides ir/, engine/ and codegen/
(their __init__.py) belong to no one chapter.

The folders follow the pipeline, with tinygrad's names: tensor/ (the Tensor and autograd) ->
ir/ (UOp, views, rewriting) -> engine/schedule.py (kernels) -> opt/ (the actions that shape a
kernel) -> codegen/ (kernel -> linear program) -> render/ (source) -> runtime/ (compile, run);
engine/realize.py runs a schedule and engine/jit.py replays one. The data flow of
`(a + b).relu().sum()`: tensor/ builds a lazy UOp graph -> engine/schedule.py cuts it into
kernels -> codegen/lower.py turns each into loops -> render/ writes C -> runtime/cpu.py
compiles and runs it. Set DEBUG=1..5 (or `with Context(DEBUG=4):`) to watch every stage.

Layering: a module imports only from modules *below* it in this order (a test checks it), and
no two modules import each other, even inside a function (the one import circle is the magic's
bridge, `%load_ext tinyteach`, below): settings, helpers, dtype, ir/uop, ir/view, ir/rewrite,
device, engine/schedule, codegen/, opt/, render/, runtime/, engine/realize, tensor/, then
engine/jit, nn/ and exercises/ on top. settings.py lists every setting and chapters.py, beside
it, the chapters, both importing nothing; codegen/ lowers the plan that opt/'s actions build
(opt/kernel.py applies them, opt/heuristic.py chooses them); opt/search.py, which compiles and
times kernels, sits with engine/realize.
tensor/ is the core (tensor/core.py: graph, realize, primitive ops, autograd), the parts on it
in order (tensor/create.py, tensor/movement.py, tensor/math.py, tensor/nn.py) and
tensor/indexing.py, with tensor/__init__.py on top assembling them into Tensor;
tensor/gradient.py and tensor/multi.py (the graphs of a tensor sharded over several devices)
sit below the core, which holds a MultiUOp as a sharded tensor's `uop`.
"""
from tinyteach import nn  # noqa: E402  # chapter 11 builds on everything above
from tinyteach.device import Device
from tinyteach.dtype import dtypes
from tinyteach.engine.jit import TinyJit, function
from tinyteach.helpers import DEBUG, Context, GlobalCounters, clear_caches, getenv
from tinyteach.ir.uop import UOp, Variable
from tinyteach.tensor import Tensor

__all__ = ["Tensor", "TinyJit", "dtypes", "Device", "Context", "DEBUG", "GlobalCounters", "nn",
           "getenv", "clear_caches", "Variable", "UOp", "function"]


def load_ipython_extension(ipython: object) -> None:
    """`%load_ext tinyteach`: the magics and rich display live in `viz`, imported only now
    (tinyteach itself never imports viz or IPython)."""
    from viz.magic import load_ipython_extension as load_viz

    load_viz(ipython)
