from nbhelp import Book


def build() -> Book:
    b = Book("lower")
    b.md("""
    # Chapter 7 — Lowering: loops, indices, optimizations

    A kernel from chapter 6 is still a *graph*: `SINK(STORE(DEFINE_GLOBAL 0, value))`, with shapes
    but no loops. This chapter turns it into a **straight-line program** a renderer can print:

    - one loop per output axis (`gidx0`, `gidx1`), a loop per reduced axis (`ridx0`) around an
      accumulator;
    - movement ops become **index arithmetic** on the loop counters, which the symbolic rewrite
      rules of chapter 5 then simplify;
    - `linearize` orders everything: open loops, load, compute, accumulate, close loops — and puts
      work that does not depend on an inner loop outside it;
    - **optimizations** lay the same kernel out to run faster: *upcast* (compute a 4×4 tile of
      outputs per iteration, so each load serves several accumulators) and *threads* (split the
      outer loop across cores). `NOOPT=1` turns them off, `DEBUG=3` lists them.

    Modules: [`tinyteach/lower.py`](../tinyteach/lower.py) (`lower_ast`, `linearize`, `lower`,
    `LinearProgram`) and [`tinyteach/opt.py`](../tinyteach/opt.py) (`choose_options`,
    `KernelOptions`).
    """)
    b.setup('''
    from collections import Counter

    from tinyteach.lower import lower
    from tinyteach.opt import NO_OPTIONS, KernelOptions, choose_options
    from tinyteach.realize import compile_kernel
    from tinyteach.render.c import CRenderer
    from tinyteach.rewrite import record_rewrites
    from tinyteach.schedule import create_schedule
    from tinyteach.uop import Ops, pretty


    def kernel_of(tensor):
        """The (last) kernel that realizing `tensor` would run."""
        items, _ = create_schedule([tensor.uop], "CPU")
        return items[-1]


    def c_source(item, options=NO_OPTIONS):
        return CRenderer().render(item.name, lower(item.ast, options))
    ''')
    b.md("""
    ## From AST to loops

    Take the smallest kernel with a reduction: the row sums of a 4×8 matrix. Its AST says *what*
    to compute:
    """)
    b.code('''
    x = Tensor(np.arange(32, dtype=np.float32).reshape(4, 8)).realize()
    row_sums = kernel_of(x.sum(1))
    print(pretty(row_sums.ast))
    ''')
    b.md("""
    `lower` says *how*: `NO_OPTIONS` keeps the plain layout (we turn to optimizations below).
    Read it top to bottom: the two buffers, the output loop `('g', 0, 4)`, the row offset
    `gidx0*8` (computed once, outside the inner loop), the accumulator starting at `0.0`, the
    reduction loop `('r', 0, 8)`, a load at `gidx0*8 + ridx0`, the accumulate, and the store after
    the loop closes.
    """)
    b.code('''
    program = lower(row_sums.ast, NO_OPTIONS)
    print(program)
    ops = [u.op for u in program.uops]
    assert ops.count(Ops.RANGE) == 2 and ops.count(Ops.END_RANGE) == 2
    assert Ops.DEFINE_ACC in ops and Ops.ACCUMULATE in ops
    print("loop sizes of the output:", program.global_sizes)
    ''')
    b.md("""
    The same program as C (chapter 8 explains the renderer). Each line above maps to one here:
    """)
    b.code('''
    print(c_source(row_sums))
    ''')
    b.md("""
    ## Movement ops become index arithmetic

    Transpose, flatten and slice: `x.permute(1, 0).reshape(32)[4:12] * 2`. No data moves; each view
    rewrites the index the kernel loads from. Chapter 4's view rules produce an index like
    `((gidx0 + 4) // 4 * ...)`, full of `* 1`, `+ 0` and divisions that the symbolic rules of
    chapter 5 tidy up. Record which rules fired while lowering:
    """)
    b.code('''
    view_kernel = kernel_of(x.permute(1, 0).reshape(32)[4:12] * 2)
    with record_rewrites() as log:
        view_program = lower(view_kernel.ast, NO_OPTIONS)
    fired = Counter(step.rule for step in log.steps)
    for rule, count in sorted(fired.items()):
        print(f"{count} x  {rule}")
    assert fired["x*1 -> x"] > 0
    print(c_source(view_kernel))
    ''')
    b.md("""
    The load index `((gidx0%4)*8) + (gidx0/4) + 1` reads element `gidx0 + 4` of the transposed,
    flattened matrix. Check it against numpy by running the kernel:
    """)
    b.code('''
    result = (x.permute(1, 0).reshape(32)[4:12] * 2).numpy()
    np.testing.assert_array_equal(result, x.numpy().T.reshape(32)[4:12] * 2)
    print(result)
    ''')
    b.md("""
    Step through every rewrite with the explorer: the slider shows each rule, with the expression
    before and after.
    """)
    b.code('''
    viz.rewrites(view_kernel)
    ''')
    b.md("""
    ## Optimizations: the same matmul, laid out differently

    A 256×256 matmul is one kernel (chapter 6). The heuristic in `choose_options` picks two upcasts
    (a 4×8 tile of outputs per iteration: 8 floats fill one vector register) and threads (the
    outer loop split across cores):
    """)
    b.code('''
    m1 = Tensor(rng.standard_normal((256, 256)).astype(np.float32)).realize()
    m2 = Tensor(rng.standard_normal((256, 256)).astype(np.float32)).realize()
    matmul = kernel_of(m1 @ m2)
    chosen = choose_options(matmul.ast)
    print(matmul.name, chosen.describe())
    with Context(NOOPT=1):
        print("with NOOPT=1:", choose_options(matmul.ast).describe())
    assert chosen.upcasts == ((0, 4), (1, 8)) and chosen.parallel
    ''')
    b.md("""
    Compile the kernel twice — once under `NOOPT=1`, once with the defaults — with the engine's own
    `compile_kernel` (lower → render → compile). First the plain version: one accumulator, one
    output element per iteration.
    """)
    b.code('''
    backend = Device["CPU"]
    with Context(NOOPT=1):
        plain = compile_kernel(backend, matmul.name, matmul.ast)
    tiled = compile_kernel(backend, matmul.name, matmul.ast)
    print(plain.source)
    ''')
    b.md("""
    The optimized one: the output loops now run 64 and 32 times (256 / 4, 256 / 8), there are 32
    accumulators, and each value loaded from `a` is multiplied with eight values of `b` (and each
    value of `b` with four of `a`). The
    OpenMP pragma hands the outer loop to several threads. Only its beginning is shown:
    """)
    b.code('''
    lines = tiled.source.splitlines()
    print("\\n".join(lines[:34]))
    print(f"... {len(lines)} lines in all (the plain kernel has {len(plain.source.splitlines())})")
    assert "#pragma omp parallel for" in tiled.source and "acc31" in tiled.source
    assert "acc1 " not in plain.source
    ''')
    b.md("""
    Both compute the same numbers (a tile still sums in the same order):
    """)
    b.code('''
    from tinyteach.device import Buffer

    def run(runner):
        output = Buffer("CPU", 256 * 256, m1.dtype)
        runner.program(output, *matmul.buffers[1:])
        return output.numpy().reshape(256, 256)

    np.testing.assert_allclose(run(plain), run(tiled), rtol=1e-6)
    np.testing.assert_allclose(run(tiled), m1.numpy() @ m2.numpy(), rtol=1e-4, atol=1e-4)
    print("same result: yes")
    ''')
    b.md("""
    Is it faster? Measure, don't guess. Timings vary from run to run and machine to machine (in
    the stored notebook they read `TIME us`). On some machines `gcc -O3` already vectorizes the
    plain loop so well that the hand-made tile does not win at this size, and waking threads costs
    more than a small kernel takes: a heuristic is a guess, which is why tinygrad also has a search
    (BEAM) that times candidates. Run the cell on your machine and compare.
    """)
    b.code('''
    import time

    def best_time(runner, repeats=20):
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            runner.program(*matmul.buffers)
            times.append(time.perf_counter() - start)
        return min(times)

    for label, runner in (("NOOPT=1", plain), ("default", tiled)):
        print(f"{label:8} {best_time(runner) * 1e6:.1f} us")
    ''')
    b.md("""
    `DEBUG=3` lists the optimizations the engine applied to each kernel it compiles (along with the
    AST and the fusion reasons of chapter 6). A new shape means a new kernel, so this one compiles:
    """)
    b.code('''
    m3 = Tensor(rng.standard_normal((32, 256)).astype(np.float32)).realize()
    with Context(DEBUG=3):
        (m3 @ m2).realize()
    ''')
    b.md("""
    ## Every stage at once

    `viz.kernel` shows a kernel's summary (launch sizes, the optimizations `choose_options`
    picked), its AST, its linear program and its source in every language of chapter 8 — here the
    optimized 256×256 matmul:
    """)
    b.code('''
    viz.kernel(m1 @ m2)
    ''')
    b.md("""
    and `%%tinyteach` shows what a cell launched, with the source that ran:
    """)
    b.code('''
    %%tinyteach --show kernels,source
    (m3 @ m2).relu().realize()
    ''')
    b.md("## Try it")
    b.exercise("column sums", """
        Lower `x.sum(0)` (shape (4, 8) → (8,)) with `NO_OPTIONS`. How many output iterations and how
        many reduction iterations does it have? Find the two `RANGE` uops and check their sizes.
        """, '''
        program = lower(kernel_of(x.sum(0)).ast, NO_OPTIONS)
        ranges = [u.arg for u in program.uops if u.op is Ops.RANGE]
        print(ranges)
        assert ranges == [("g", 0, 8), ("r", 0, 4)]
        ''')
    b.exercise("no tile for elementwise", """
        What does `choose_options` pick for the elementwise kernel of `m1 + m2`, and why no upcast?
        (Read `choose_options` in `opt.py`.)
        """, '''
        print(choose_options(kernel_of(m1 + m2).ast).describe())
        # no reduction: a tile would share no loads, so there is nothing to gain from an upcast;
        # 65,536 elements is also below PARALLEL_MIN_WORK, so no threads
        assert choose_options(kernel_of(m1 + m2).ast).upcasts == ()
        ''')
    b.exercise("your own options", """
        Lower the 256×256 matmul with `KernelOptions(upcasts=((1, 4),))` — a 1×4 tile, no threads.
        How many accumulators does the program define?
        """, '''
        program = lower(matmul.ast, KernelOptions(upcasts=((1, 4),)))
        accumulators = [u for u in program.uops if u.op is Ops.DEFINE_ACC]
        print(len(accumulators), "accumulators; output loops", program.global_sizes)
        assert len(accumulators) == 4 and program.global_sizes == (256, 64)
        ''')
    return b
