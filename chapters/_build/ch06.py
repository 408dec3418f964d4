from nbhelp import Book


def build() -> Book:
    b = Book("sched")
    b.md("""
    # Chapter 6 — Scheduling: kernel fusion

    Up to now a Tensor expression has been a lazy graph of UOps. This chapter answers the question
    *how many programs does the machine actually run, and why that many?*

    - a **kernel** reads some buffers and writes exactly one; everything computed in between stays
      in registers. Memory traffic is what costs, so the scheduler fuses as much as it can;
    - elementwise ops always fuse — into the input of a reduction, onto its output, and with each
      other;
    - a reduction is stored in its own buffer only for a stated reason: its result is broadcast
      back over the axes it reduced, it feeds another reduction, or several kernels need it;
    - every cut and every fusion is written down in plain words, so you can ask *why*.

    The chapter's module is [`tinyteach/schedule.py`](../tinyteach/schedule.py) (`create_schedule`,
    `ScheduleItem`); the drawings come from [`viz/schedule.py`](../viz/schedule.py) and
    [`viz/graph.py`](../viz/graph.py).
    """)
    b.setup('''
    from tinyteach.schedule import create_schedule


    def schedule_of(*tensors):
        """The kernels realizing `tensors` would run (nothing runs)."""
        items, _ = create_schedule([t.uop for t in tensors], "CPU")
        return items


    def random_tensor(*shape):
        return Tensor(rng.standard_normal(shape).astype(np.float32)).realize()
    ''')
    b.md("""
    ## One expression, one kernel

    Start with three realized 4×4 inputs and the chapter's running example,
    `((a + b) * c).relu().sum(1)`: an add, a multiply, a relu and a sum over rows. Naively that is
    four loops with three temporary arrays. `create_schedule` cuts the graph into kernels:
    """)
    b.code('''
    a, b, c = random_tensor(4, 4), random_tensor(4, 4), random_tensor(4, 4)
    out = ((a + b) * c).relu().sum(1)
    items = schedule_of(out)
    print([item.name for item in items])
    assert len(items) == 1
    ''')
    b.md("""
    One kernel, named as tinygrad names them: `r_` for a kernel with a reduction, then the sizes
    (4 output rows, 4 summed columns). Each `ScheduleItem` carries the reason its result is stored
    and a list of what it fused:
    """)
    b.code('''
    item = items[0]
    print("stored because:", item.boundary_reason)
    for note in item.fusions + item.input_reasons:
        print(" -", note)
    assert "ADD" in item.fusions[1] and "MUL" in item.fusions[1]
    ''')
    b.md("""
    The relu appears as `CMPLT` and `WHERE` (it is `where(x < 0, 0, x)` in primitive ops), and the
    broadcast of the sum's shape is just `RESHAPE`/`EXPAND` — index arithmetic, not a copy. The same
    information, drawn: one cluster per kernel, its fusions inside, its inputs as cylinders.
    """)
    b.code('''
    viz.schedule(out)
    ''')
    b.md("""
    Scheduling plans; realizing runs. `GlobalCounters` counts every launch, so we can check that
    the plan is what happens — and that the fused kernel computes what numpy computes:
    """)
    b.code('''
    GlobalCounters.reset()
    result = out.numpy()
    print("kernels launched:", GlobalCounters.kernel_count)
    assert GlobalCounters.kernel_count == 1
    expected = np.maximum((a.numpy() + b.numpy()) * c.numpy(), 0).sum(1)
    np.testing.assert_allclose(result, expected, rtol=1e-5)
    ''')
    b.md("""
    ## A matmul is one kernel too

    `a @ b` is built from primitives as *reshape, broadcast, multiply, sum*: `a` becomes
    (4, 4, 1) → broadcast (4, 4, 4), `b` is transposed and broadcast the other way, and the product
    is summed over the last axis. The broadcasts never exist in memory: they are index math, and the
    multiply fuses into the sum's input.
    """)
    b.code('''
    matmul = schedule_of(a @ b)
    print([i.name for i in matmul])
    for note in matmul[0].fusions:
        print(" -", note)
    assert len(matmul) == 1 and matmul[0].name == "r_4_4_4"
    ''')
    b.md("""
    ## Softmax needs three kernels — and each cut has a reason

    `softmax(x) = exp(x - max(x)) / sum(exp(x - max(x)))` along a row. There are two reductions,
    and both results are *broadcast back* over the row they reduced: every element needs its row's
    max, then its row's sum. Fusing that would mean recomputing the whole reduction for every
    element, so the scheduler stores each reduction in a small buffer. (The max is needed by two
    kernels — the sum and the division — and that is the first reason the scheduler finds.)
    """)
    b.code('''
    softmax_items = schedule_of(a.softmax(1))
    for number, item in enumerate(softmax_items, 1):
        print(f"kernel {number}: {item.name:6} stored because {item.boundary_reason}")
    assert len(softmax_items) == 3
    assert "broadcast back" in softmax_items[1].boundary_reason
    ''')
    b.md("""
    The arrows in the drawing are labelled with the reason the value had to go through memory:
    """)
    b.code('''
    viz.schedule(a.softmax(1))
    ''')
    b.md("""
    In the lazy graph, each node is coloured by the kernel it lands in. The subtraction
    `x - max` is needed by kernel 2 (for the sum) *and* by kernel 3 (for the division): it is
    drawn striped, because the scheduler recomputes cheap elementwise work rather than storing it.
    """)
    b.code('''
    viz.graph(a.softmax(1))
    ''')
    b.md("""
    ## The three reasons, one at a time

    A reduction stays fused with what uses it unless one of these holds. Each case below is the
    smallest expression that triggers it.
    """)
    b.code('''
    cases = {
        "broadcast back": a - a.mean(1, keepdim=True),
        "reduction of a reduction": a.sum(1).max(),
    }
    for name, tensor in cases.items():
        items = schedule_of(tensor)
        print(f"{name}: {len(items)} kernels; the first is stored because {items[0].boundary_reason}")
        assert len(items) == 2
    ''')
    b.md("""
    The third reason needs *two outputs*. Realize `s + 1` and `s * 2` together (both read the same
    sum `s`): storing `s` once is cheaper than summing twice.
    """)
    b.code('''
    s = a.sum(1)
    shared = schedule_of(s + 1, s * 2)
    for item in shared:
        print(f"{item.name}: {item.boundary_reason}")
    assert len(shared) == 3 and "used by 2 kernels" in shared[0].boundary_reason
    ''')
    b.md("""
    Elementwise work is the opposite: it is *recomputed* in every kernel that needs it. Two sums of
    the same `exp` read the input twice, but nothing is stored in between:
    """)
    b.code('''
    e = (a * 2).exp()
    both = schedule_of(e.sum(0), e.sum(1))
    print([item.name for item in both])
    assert len(both) == 2 and all("EXP2" in " ".join(item.fusions) for item in both)
    ''')
    b.md("""
    ## `DEBUG=3` says the same thing

    The engine prints each kernel's reason, its fusions and its AST before running it — the AST is
    `SINK(STORE(DEFINE_GLOBAL 0, value))`, with the inputs as `DEFINE_GLOBAL 1, 2, ...`
    (timings are replaced by `TIME` in the stored notebook).
    """)
    b.code('''
    with Context(DEBUG=3):
        (a + b).sum(1).realize()
    ''')
    b.md("""
    ## `%%tinyteach`: run a cell, see its kernels

    The magic records every launch in the cell and shows the kernels with their fusion reasons.
    Layer norm without the scale: two reductions, each broadcast back.
    """)
    b.code('''
    %%tinyteach --show kernels,schedule
    x = random_tensor(8, 16)
    centered = x - x.mean(1, keepdim=True)
    normalized = centered / (centered * centered).mean(1, keepdim=True).add(1e-5).sqrt()
    normalized.realize()
    ''')
    b.code('''
    assert np.allclose(normalized.numpy().mean(1), 0, atol=1e-5)
    ''')
    b.md("""
    ## Try it
    """)
    b.exercise("fuse onto a matmul", """
        Predict how many kernels `(a @ b).relu() + c` takes, then check with `schedule_of`.
        """, '''
        items = schedule_of((a @ b).relu() + c)
        print(len(items), items[0].fusions[-2])
        assert len(items) == 1  # relu and + c fuse onto the reduction's output
        ''')
    b.exercise("force a cut", """
        `.contiguous()` asks for a fresh buffer. Use it to make `a + b` its own kernel in
        `((a + b) * c).sum(1)`, and print the reason the scheduler gives.
        """, '''
        items = schedule_of(((a + b).contiguous() * c).sum(1))
        print([(item.name, item.boundary_reason) for item in items])
        assert len(items) == 2 and "contiguous" in items[0].boundary_reason
        ''')
    b.exercise("count a log-softmax", """
        How many kernels does `a.log_softmax(1)` take, and what is each one stored for? Check your
        answer with `GlobalCounters.kernel_count` after realizing it.
        """, '''
        items = schedule_of(a.log_softmax(1))
        for item in items:
            print(item.name, "-", item.boundary_reason)
        GlobalCounters.reset()
        a.log_softmax(1).realize()
        assert GlobalCounters.kernel_count == len(items)
        ''')
    return b
