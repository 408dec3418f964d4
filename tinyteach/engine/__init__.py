"""The engine, with tinygrad's names: from a graph to kernels, and running them.

| module      | chapter | what it holds                                                     |
|-------------|---------|-------------------------------------------------------------------|
| schedule.py | 6       | cutting the lazy graph into kernels, with a reason for every cut  |
| realize.py  | 9       | the executor: a Plan (buffers, steps) and one `run`, memory plans |
| jit.py      | 10      | TinyJit: capture a function's launches once, replay the plan      |

schedule.py sits low (codegen/ and opt/ read its ScheduleItem); realize.py and jit.py sit
above codegen/, opt/, render/ and runtime/, which they drive.
"""
