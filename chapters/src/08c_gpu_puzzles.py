# %% [markdown] id="pz-01"
# # Chapter 8c — GPU puzzles: kernels graded by the emulator
#
# Chapter 8b let the optimizer write GPU kernels. Here you write them, one puzzle at a time, in
# the spirit of Sasha Rush's [GPU-Puzzles](https://github.com/srush/GPU-Puzzles) and
# [Triton-Puzzles](https://github.com/srush/Triton-Puzzles). Each puzzle is a task with a numpy
# spec, a launch (how many work-groups of how many threads) and a budget of reads per thread.
# You write the kernel that **every thread** runs; the PYTHON device's emulator (chapter 8b)
# runs it and grades it:
#
# - the **values** must be the spec's (`out` starts as NaN, so an element nobody writes shows);
# - **no race**: two threads that touch one element of shared memory between two barriers, one
#   of them writing, or two threads that write one element of global memory;
# - **no access out of bounds**, and no barrier that some threads of a group never reach;
# - each thread reads at most so many elements of **global** and of **shared** memory.
#
# Every failure names the thread, as the emulator does. The grader is
# [`tinyteach/exercises/gpu_puzzles.py`](../tinyteach/exercises/gpu_puzzles.py); from a
# terminal, `python -m tinyteach.exercises exercises/08c_gpu_puzzles_student.ipynb` grades every
# kernel of a notebook. This notebook holds the solutions: work in the student copy,
# `exercises/08c_gpu_puzzles_student.ipynb` (what `make course` serves), where each kernel's
# body is `raise NotImplementedError()`.

# %% id="pz-02"
from tinyteach import Device, Tensor

Device.DEFAULT = "CPU"   # the puzzles run on the emulator; nothing here uses a device
Tensor.manual_seed(0)

from tinyteach.exercises.gpu_puzzles import PUZZLES, check, grade_puzzles, run_puzzle, solves
from viz.threads import shared_traffic, thread_map

# %% [markdown] id="pz-03"
# ## How a kernel is written
#
# A kernel is a Python function `kernel(k, out, a, ...)`, marked with `@solves("puzzle name")`.
# It runs **once**, for all the threads at the same time: each line builds a step of the
# program (UOps, chapter 3), and the emulator then runs that program in every thread, each with
# its own ids. So a thread's value is never a Python number, and these are the tools:
#
# | write | means (CUDA) |
# |---|---|
# | `k.thread_id(0)`, `k.thread_id(1)` | the thread's index in its work-group along x, y (`threadIdx`) |
# | `k.group_id(0)` | the work-group's index (`blockIdx`); `k.group_size(0)` is its number of threads, a Python int |
# | `a[i]`, `out[i] = v` | a load and a store, each thread at its own `i`. Memory is flat: element (row, column) of a matrix `w` wide is `row * w + column` |
# | `with k.when(i < n):` | the loads and stores inside happen only in the threads where the condition holds (`if`); a load that does not happen gives 0 |
# | `for t in k.loop(n):` | a loop every thread runs n times, t = 0, 1, ..., n - 1 |
# | `s = k.shared(n)` | n float32s of shared memory, one per work-group (`__shared__`) |
# | `k.barrier()` | every thread of the group waits until all have arrived (`__syncthreads()`) |
# | `acc = k.register(0.0)`, `acc += x` | a thread's accumulator: `+=` adds in every step of the loops around it |
#
# Python's own `if` and `for` still work on Python numbers (the sizes): they decide what the
# program *is*, the same for every thread. `if i < 4:` on a thread's value is an error that says
# to write `with k.when(i < 4):`.
#
# ## What the grader catches
#
# Four kernels that go wrong, one check each. A kernel that reads past the end of its input
# (on a GPU this reads garbage, or crashes):

# %% id="pz-04" tags=["skip-when-grading"]
@solves("guard")
def unguarded(k, out, a):
    i = k.thread_id(0)
    out[i] = a[i] + 10


report = check(unguarded)
assert "thread (4, 0, 0) of work-group (0, 0, 0) reads a[4]" in str(report)
report

# %% [markdown] id="pz-05"
# A race: each thread puts its element in shared memory and thread 0 adds the first two, with
# no barrier between the writes and the read. On a GPU thread 0 might read element 1 before
# thread 1 has written it; the emulator names both threads:

# %% id="pz-06" tags=["skip-when-grading"]
@solves("block sum")
def no_barrier(k, out, a):
    i, g = k.thread_id(0), k.group_id(0)
    partial = k.shared(8)
    partial[i] = a[g * 8 + i]
    with k.when(i == 0):
        out[g] = partial[0] + partial[1]


report = check(no_barrier)
assert "thread (0, 0, 0) of work-group (0, 0, 0) reads local0[1], which thread (1, 0, 0)" \
    in str(report)
print(report)

# %% [markdown] id="pz-07"
# A barrier that only some threads reach (the group would wait forever), and every thread of a
# group writing the same output element (which write survives is undefined):

# %% id="pz-08" tags=["skip-when-grading"]
@solves("block sum")
def divergent(k, out, a):
    i = k.thread_id(0)
    with k.when(i < 4):
        k.barrier()


@solves("block sum")
def everyone_writes(k, out, a):
    i, g = k.thread_id(0), k.group_id(0)
    out[g] = a[g * 8 + i]


report = grade_puzzles([divergent, everyone_writes])
text = str(report)
assert "4 threads wait at the barrier but 4 never reach it, e.g. thread (4, 0, 0)" in text
assert "thread (1, 0, 0) of work-group (0, 0, 0) writes out[0], which thread (0, 0, 0)" in text
print(report)

# %% [markdown] id="pz-09"
# ## Puzzle 1: map
#
# One thread per element: thread `i` adds 10 to `a[i]`.

# %% id="pz-10" tags=["skip-when-grading"]
print(PUZZLES["map"].describe())


# %% id="pz-11" nbgrader={"grade": false, "grade_id": "pz-11", "locked": false, "schema_version": 3, "solution": true, "task": false}
@solves("map")
def map_kernel(k, out, a):
    ### BEGIN SOLUTION
    i = k.thread_id(0)
    out[i] = a[i] + 10
    ### END SOLUTION


# %% id="pz-12" tags=["skip-when-grading"]
check(map_kernel)

# %% [markdown] id="pz-13"
# What the emulator ran: the program your function built (chapter 8b's linear program). The
# thread id is a `SPECIAL`, the loop over work-groups a `RANGE` of kind `'w'`; then the load, the
# addition and the store. And who wrote which element of `out` (the kernel's parameter 0,
# `data0` to the emulator):

# %% id="pz-14" tags=["skip-when-grading"]
run = run_puzzle(map_kernel)
print(run.program)
thread_map(run.trace, "data0", kind="write", columns=4)

# %% [markdown] id="pz-15"
# ## Puzzle 2: guard
#
# Eight threads for four elements. Threads 4 to 7 must not touch memory (the first check above
# showed what happens when they do).

# %% id="pz-16" tags=["skip-when-grading"]
print(PUZZLES["guard"].describe())


# %% id="pz-17" nbgrader={"grade": false, "grade_id": "pz-17", "locked": false, "schema_version": 3, "solution": true, "task": false}
@solves("guard")
def guard_kernel(k, out, a):
    ### BEGIN SOLUTION
    i = k.thread_id(0)
    with k.when(i < a.size):
        out[i] = a[i] + 10
    ### END SOLUTION


# %% id="pz-18" tags=["skip-when-grading"]
check(guard_kernel)

# %% [markdown] id="pz-19"
# ## Puzzle 3: broadcast
#
# A 4×4 work-group for a 3×3 output: `out[i, j] = a[i] + b[j]`. Thread (x, y) is column x and
# row y (neighbouring threads, x, write neighbouring elements, as chapter 8b's kernels do).
# Guard both.

# %% id="pz-20" tags=["skip-when-grading"]
print(PUZZLES["broadcast"].describe())


# %% id="pz-21" nbgrader={"grade": false, "grade_id": "pz-21", "locked": false, "schema_version": 3, "solution": true, "task": false}
@solves("broadcast")
def broadcast_kernel(k, out, a, b):
    ### BEGIN SOLUTION
    column, row = k.thread_id(0), k.thread_id(1)
    with k.when((row < 3) & (column < 3)):
        out[row * 3 + column] = a[row] + b[column]
    ### END SOLUTION


# %% id="pz-22" tags=["skip-when-grading"]
check(broadcast_kernel)

# %% [markdown] id="pz-23"
# ## Puzzle 4: blocks
#
# Nine elements, three work-groups of four threads. A thread's element is its group's first
# element plus its index in the group; the last group has three threads too many.

# %% id="pz-24" tags=["skip-when-grading"]
print(PUZZLES["blocks"].describe())


# %% id="pz-25" nbgrader={"grade": false, "grade_id": "pz-25", "locked": false, "schema_version": 3, "solution": true, "task": false}
@solves("blocks")
def blocks_kernel(k, out, a):
    ### BEGIN SOLUTION
    i = k.group_id(0) * k.group_size(0) + k.thread_id(0)
    with k.when(i < a.size):
        out[i] = a[i] + 10
    ### END SOLUTION


# %% id="pz-26" tags=["skip-when-grading"]
check(blocks_kernel)

# %% [markdown] id="pz-27"
# Each group's four threads, numbered 0 to 3 within their group, wrote four neighbouring
# elements; the last group's thread 0 wrote element 8 and its other three nothing:

# %% id="pz-28" tags=["skip-when-grading"]
thread_map(run_puzzle(blocks_kernel).trace, "data0", kind="write", columns=9)

# %% [markdown] id="pz-29"
# ## Puzzle 5: a sum in shared memory
#
# Work-group g sums its block of 8 elements: `out[g] = a[8g] + ... + a[8g + 7]`. Each thread may
# read one element from global memory, so the sum happens in shared memory; and no thread may
# read more than 7 elements of it, so thread 0 cannot add all 8 alone. The threads share the
# work as a *tree*: halve the number of partial sums at each step. Mind the barriers.

# %% id="pz-30" tags=["skip-when-grading"]
print(PUZZLES["block sum"].describe())


# %% id="pz-31" nbgrader={"grade": false, "grade_id": "pz-31", "locked": false, "schema_version": 3, "solution": true, "task": false}
@solves("block sum")
def block_sum_kernel(k, out, a):
    ### BEGIN SOLUTION
    i, g = k.thread_id(0), k.group_id(0)
    partial = k.shared(8)
    partial[i] = a[g * 8 + i]
    k.barrier()
    step = 4
    while step >= 1:  # a Python loop over Python numbers: it writes three steps of the program
        with k.when(i < step):
            partial[i] = partial[i] + partial[i + step]
        k.barrier()
        step //= 2
    with k.when(i == 0):
        out[g] = partial[0]
    ### END SOLUTION


# %% id="pz-32" tags=["skip-when-grading"]
check(block_sum_kernel)

# %% [markdown] id="pz-33"
# Shared memory between the barriers, from the emulator's record: 8 writes, then each step of
# the tree reads twice as many partial sums as it writes, down to thread 0's read of the total:

# %% id="pz-34" tags=["skip-when-grading"]
shared_traffic(run_puzzle(block_sum_kernel).trace)

# %% [markdown] id="pz-35"
# ## Puzzle 6: prefix sum
#
# An inclusive scan: `out[i] = a[0] + ... + a[i]`, 8 elements, 8 threads, each reading one
# element from global memory and at most 6 from shared memory. After step s of a
# Hillis–Steele scan, thread i holds the sum of the 2^s elements ending at i: it adds the
# partial sum 1, then 2, then 4 places to its left. A thread must not overwrite its partial
# sum while its neighbour may still read it.

# %% id="pz-36" tags=["skip-when-grading"]
print(PUZZLES["prefix sum"].describe())


# %% id="pz-37" nbgrader={"grade": false, "grade_id": "pz-37", "locked": false, "schema_version": 3, "solution": true, "task": false}
@solves("prefix sum")
def prefix_sum_kernel(k, out, a):
    ### BEGIN SOLUTION
    i = k.thread_id(0)
    partial = k.shared(8)
    partial[i] = a[i]
    k.barrier()
    total = partial[i]
    for step in (1, 2, 4):
        with k.when(i >= step):
            left = partial[i - step]  # 0 in the threads with nothing to the left
        total = total + left
        k.barrier()  # every thread has read before any writes
        partial[i] = total
        k.barrier()  # every thread has written before any reads
    out[i] = total
    ### END SOLUTION


# %% id="pz-38" tags=["skip-when-grading"]
check(prefix_sum_kernel)

# %% [markdown] id="pz-39"
# ## Puzzle 7: a tiled matmul
#
# `out = a @ b` for an 8×12 `a` and a 12×8 `b`, in 2×2 work-groups of 4×4 threads: thread (x, y)
# of group (gx, gy) computes row 4·gy + y, column 4·gx + x. The kernel that reads its row of `a`
# and its column of `b` straight from global memory reads 24 elements per thread:

# %% id="pz-40" tags=["skip-when-grading"]
@solves("tiled matmul")
def one_thread_per_output(k, out, a, b):
    column, row = k.thread_id(0), k.thread_id(1)
    i, j = k.group_id(1) * 4 + row, k.group_id(0) * 4 + column
    acc = k.register(0.0)
    for t in k.loop(12):
        acc += a[i * 12 + t] * b[t * 8 + j]
    out[i * 8 + j] = acc


report = check(one_thread_per_output)
assert "reads 24 elements of global memory" in str(report)
print(report)

# %% [markdown] id="pz-41"
# The budget is 6. In each of 3 steps along the reduction, the 16 threads of a group copy a
# 4×4 tile of `a` and one of `b` into shared memory, one element of each per thread; after a
# barrier each thread adds its row of the `a` tile times its column of the `b` tile; a barrier
# again before the next step's copies overwrite the tiles (chapter 8b's local tiles, by hand).

# %% id="pz-42" tags=["skip-when-grading"]
print(PUZZLES["tiled matmul"].describe())


# %% id="pz-43" nbgrader={"grade": false, "grade_id": "pz-43", "locked": false, "schema_version": 3, "solution": true, "task": false}
@solves("tiled matmul")
def matmul_kernel(k, out, a, b):
    ### BEGIN SOLUTION
    column, row = k.thread_id(0), k.thread_id(1)
    i, j = k.group_id(1) * 4 + row, k.group_id(0) * 4 + column
    a_tile, b_tile = k.shared(16), k.shared(16)
    acc = k.register(0.0)
    for step in k.loop(3):
        a_tile[row * 4 + column] = a[i * 12 + step * 4 + column]
        b_tile[row * 4 + column] = b[(step * 4 + row) * 8 + j]
        k.barrier()
        for t in k.loop(4):
            acc += a_tile[row * 4 + t] * b_tile[t * 4 + column]
        k.barrier()
    out[i * 8 + j] = acc
    ### END SOLUTION


# %% id="pz-44" tags=["skip-when-grading"]
check(matmul_kernel)

# %% [markdown] id="pz-45"
# ## All the puzzles
#
# The grader's report for every kernel of this notebook, as `python -m tinyteach.exercises`
# prints it:

# %% id="pz-46" tags=["skip-when-grading"]
everything = grade_puzzles([map_kernel, guard_kernel, broadcast_kernel, blocks_kernel,
                            block_sum_kernel, prefix_sum_kernel, matmul_kernel])
print(everything)
