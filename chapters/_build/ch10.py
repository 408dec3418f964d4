from nbhelp import Book


def build() -> Book:
    b = Book("jit")
    b.md("""
    # Chapter 10 — The JIT and graph execution

    A training step builds the *same* graph every time: Python builds UOps, the scheduler cuts
    kernels, the engine looks up programs — and out comes the same list of kernel launches, only
    on new data. `TinyJit` skips all of that after it has seen the function twice:

    - **call 1** runs the function normally (compiling every kernel);
    - **call 2** runs it again while *capturing* every launch: program, buffers, sizes;
    - **call 3 on** *replays* that list with the new input buffers swapped in, without running the
      Python that built the graph;
    - the JIT is honest: `DEBUG=1` says when it captured and what it replays, and an input of
      another shape, dtype or device is an error with a clear message, never a silent wrong result;
    - **graph execution**: on the CPU a replay is one native call — a small generated C function
      calls every kernel in turn.

    Modules: [`tinyteach/jit.py`](../tinyteach/jit.py) (`TinyJit`, `CapturedJit`) and
    `CPUGraph` in [`tinyteach/runtime/cpu.py`](../tinyteach/runtime/cpu.py).
    """)
    b.setup('''
    from tinyteach import TinyJit
    from tinyteach.jit import JitError
    from tinyteach.runtime.cpu import CPUGraph, render_graph
    ''')
    b.md("""
    ## Capture and replay

    A small function: a layer with a fixed weight, then a softmax. We count how often its *Python
    body* runs.
    """)
    b.code('''
    weight = Tensor(rng.standard_normal((8, 4)).astype(np.float32)).realize()
    body_runs = 0

    @TinyJit
    def layer(x: Tensor) -> Tensor:
        global body_runs
        body_runs += 1
        return (x @ weight).relu().softmax(1).realize()


    def reference(x: np.ndarray) -> np.ndarray:
        logits = np.maximum(x @ weight.numpy(), 0)
        e = np.exp(logits - logits.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)


    inputs = [rng.standard_normal((2, 8)).astype(np.float32) for _ in range(5)]
    ''')
    b.md("""
    Call it five times with new data each time, with `DEBUG=1` on so each call shows what runs.
    Call 1 launches kernels one by one; call 2 launches them again and says it captured them;
    calls 3-5 each print a single line: the replay (its time reads `TIME` in the stored notebook).
    """)
    b.code('''
    for call, data in enumerate(inputs, 1):
        print(f"--- call {call}")
        with Context(DEBUG=1):
            out = layer(Tensor(data))
        np.testing.assert_allclose(out.numpy(), reference(data), rtol=1e-5, atol=1e-6)
    print("the Python body ran", body_runs, "times for 5 calls")
    assert body_runs == 2
    ''')
    b.md("""
    Every result was checked against numpy, including the replays. What the JIT holds is a plain
    list of launches, each with its kernel and the buffers it was called with, and the places
    where the input buffer must be swapped in:
    """)
    b.code('''
    captured = layer.captured
    for launch in captured.launches:
        print(f"{launch.item.name:10} {len(launch.buffers)} buffers")
    print("input slots (launch, argument, input):", captured.input_slots)
    assert len(captured.launches) == 4 and captured.input_slots == [(0, 1, 0)]
    ''')
    b.md("""
    The captured launches are ordinary schedule items, so viz draws them like any schedule:
    """)
    b.code('''
    viz.schedule(captured.launches)
    ''')
    b.md("""
    ## When an input changes shape

    Captured kernels have their sizes baked in: `r_2_4_8` loops over exactly 2 rows. A batch of 3
    rows cannot reuse them, and silently running them would read the wrong memory. The JIT
    checks every input against the captured signature and stops with a clear message:
    """)
    b.code('''
    try:
        layer(Tensor(rng.standard_normal((3, 8)).astype(np.float32)))
        raise AssertionError("a new shape must not replay")
    except JitError as error:
        print("JitError:", error)
    ''')
    b.md("""
    The same goes for the dtype or device of an input, and for non-Tensor arguments, which are
    baked into the kernels as constants. As the message says, `.reset()` forgets the capture;
    the next two calls then compile and capture for the new shape:
    """)
    b.code('''
    layer.reset()
    batch_of_three = [rng.standard_normal((3, 8)).astype(np.float32) for _ in range(3)]
    for data in batch_of_three:
        np.testing.assert_allclose(layer(Tensor(data)).numpy(), reference(data), rtol=1e-5,
                                   atol=1e-6)
    print([launch.item.name for launch in layer.captured.launches])
    ''')
    b.md("""
    ## State that changes: write it in place

    A training step updates its weights. The captured launches point at *buffers*, so the update
    must write into the weight's own buffer — `Tensor.assign` — rather than make a new tensor
    (which the replay would never see). One step of gradient descent on `(w - target)²`:
    """)
    b.code('''
    w = Tensor(np.zeros(3, dtype=np.float32)).realize()

    @TinyJit
    def sgd_step(target: Tensor) -> Tensor:
        loss = ((w - target) ** 2).sum()
        gradient = 2 * (w - target)
        w.assign(w - 0.25 * gradient)
        return loss.realize(), w.realize()

    target = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    for step in range(6):
        loss, _ = sgd_step(Tensor(target))
        print(f"step {step}: loss {loss.item():.4f}  w {np.array2string(w.numpy(), precision=4)}")
    assert np.allclose(w.numpy(), target * (1 - 0.5 ** 6))
    ''')
    b.md("""
    Each step halves the distance to the target, on replays too: the captured kernel writes into
    `w`'s buffer, and the next replay reads it.

    ## Graph execution

    A replay still calls every kernel from Python, a few microseconds each. On the CPU the JIT does
    better: `CPUGraph` generates a tiny C function that calls every captured kernel in turn, with
    the buffer addresses in one C array — the whole replay is one ctypes call, and only the input
    slots are rewritten between replays. This is the C it generates for two kernels with 3 and 2
    arguments:
    """)
    b.code('''
    print(render_graph([3, 2]))
    print("the captured layer replays through:", type(layer.captured.graph).__name__)
    assert isinstance(layer.captured.graph, CPUGraph)
    ''')
    b.md("""
    How much does the JIT save? Compare one eager call (build the graph, schedule, look up the
    programs, launch) with one replay. Absolute times vary from machine to machine; the ratio is
    large everywhere, so we only print whether the replay wins.
    """)
    b.code('''
    import time

    def eager(x):
        return (x @ weight).relu().softmax(1).realize()

    def best_time(function, repeats=20):
        times = []
        for _ in range(repeats):
            x = Tensor(batch_of_three[0])
            start = time.perf_counter()
            function(x)
            times.append(time.perf_counter() - start)
        return min(times)

    eager_seconds, replay_seconds = best_time(eager), best_time(layer)
    print("the replay is faster than the eager call:", replay_seconds < eager_seconds)
    assert replay_seconds < eager_seconds
    ''')
    b.md("""
    `%%tinyteach` records the launches of a cell. Replays bypass the engine, so only calls that
    *run* the function are recorded — here the first call of a new jitted function:
    """)
    b.code('''
    %%tinyteach --show kernels
    @TinyJit
    def scaled_sum(x: Tensor) -> Tensor:
        return (x * 3).sum(0).realize()

    scaled_sum(Tensor(np.ones((4, 4), dtype=np.float32)))
    ''')
    b.md("## Try it")
    b.exercise("a changing constant", """
        Write a jitted `shift(x, amount)` that returns `(x + amount).realize()`, where `amount` is
        a Python float. Call it three times with the same `amount`, then once with another one.
        What happens, and why?
        """, '''
        @TinyJit
        def shift(x: Tensor, amount: float) -> Tensor:
            return (x + amount).realize()

        for _ in range(3):
            shift(Tensor([1.0, 2.0]), 1.0)
        try:
            shift(Tensor([1.0, 2.0]), 2.0)
        except JitError as error:
            print(error)  # 1.0 is a constant inside the captured kernel's source
        ''')
    b.exercise("random numbers", """
        What does the JIT say about a function that calls `Tensor.rand`? Try
        `TinyJit(lambda x: (x + Tensor.rand(2)).realize())`, call it twice, and read the message.
        Where should the random numbers come from instead?
        """, '''
        noisy = TinyJit(lambda x: (x + Tensor.rand(2)).realize())
        noisy(Tensor([0.0, 0.0]))
        try:
            noisy(Tensor([0.0, 0.0]))
        except JitError as error:
            print(error)  # draw them outside and pass them in as an argument
        ''')
    b.exercise("how many kernels in a step?", """
        Capture `sgd_step` above again (`.reset()`, then two calls) and count its launches. Which of
        them writes into `w`'s buffer?
        """, '''
        sgd_step.reset()
        for _ in range(2):
            sgd_step(Tensor(target))
        launches = sgd_step.captured.launches
        print(len(launches), "launches:", [launch.item.name for launch in launches])
        writers = [launch.item.name for launch in launches if launch.item.node.op.name == "ASSIGN"]
        print("writes into w:", writers)
        assert len(writers) == 1
        ''')
    return b
