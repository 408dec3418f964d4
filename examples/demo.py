"""The first thing to run: one expression, several operations, one generated C kernel.

    make demo          (or: .venv/bin/python examples/demo.py)
"""

from tinyteach import Context, GlobalCounters, Tensor

Tensor.manual_seed(0)
a, b, c = Tensor.rand(4, 8), Tensor.rand(4, 8), Tensor.rand(4, 8)
for t in (a, b, c):  # make the random inputs real first, so only `out` is counted below
    t.realize()

# Nothing is computed yet: `out` is a lazy graph of add, multiply, relu and sum.
out = ((a + b) * c).relu().sum(axis=1)

# realize() schedules, fuses, generates and runs the kernel. DEBUG=4 prints the generated source.
kernels_before = GlobalCounters.kernel_count
with Context(DEBUG=4):
    out.realize()
kernels = GlobalCounters.kernel_count - kernels_before

print("result:", out.numpy())
print("kernels run for `out`:", kernels)
print(
    "The add, multiply, relu and sum were fused into that single kernel: the C source printed "
    "above computes the whole expression in one pass, without writing any intermediate tensor "
    "to memory."
)
