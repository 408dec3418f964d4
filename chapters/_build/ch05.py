"""Chapter 5: Rewriting."""
from nbtools import Book


def chapter_05(setup: str) -> Book:
    b = Book("rewrite")
    b.md("""
    # Chapter 5 — Rewriting graphs: the pattern matcher

    A compiler pass is a table of rules: *when you see this shape of graph, build that instead*.
    tinygrad writes almost every pass this way — simplification, lowering, even parts of code
    generation — and so does tinyteach.

    **What you will learn**
    - `UPat` describes a shape of graph (op, sources, arg, a name to bind the match to);
    - `PatternMatcher` is an ordered table of named rules; `graph_rewrite` applies it bottom-up
      until nothing changes;
    - constant folding and the `symbolic` rules that tidy chapter 4's index arithmetic;
    - recording every step with `record_rewrites()` and stepping through them with
      `viz.rewrites`.

    **Where it lives:** [`tinyteach/rewrite.py`](../tinyteach/rewrite.py). It builds on
    [`uop.py`](../tinyteach/uop.py) and is used by [`lower.py`](../tinyteach/lower.py), which runs
    `symbolic` over every kernel's index math.
    """)
    b.code(setup)
    b.code("""
    from tinyteach.uop import UOp, Ops
    from tinyteach.rewrite import (UPat, PatternMatcher, graph_rewrite, symbolic, record_rewrites,
                                   RewriteLog)
    from viz.rewrites import expression, steps_text
    i = UOp(Ops.RANGE, dtypes.int32, (), ("g", 0, 4))   # 0 <= gidx0 < 4
    j = UOp(Ops.RANGE, dtypes.int32, (), ("g", 1, 8))   # 0 <= gidx1 < 8
    """)
    b.md("""
    ## Patterns

    `UPat(Ops.MUL, src=(UPat.var("x"), UPat.const(1)))` matches a `MUL` whose sources are
    anything (bound to the name `x`) and the constant 1. `match` fills a dict of bindings.
    Patterns on commutative ops match both orders, so `1 * x` matches too.
    """)
    b.code("""
    times_one = UPat(Ops.MUL, src=(UPat.var("x"), UPat.const(1)))
    for node in [i * 1, 1 * i, i * 2]:
        bindings = {}
        matched = times_one.match(node, bindings)
        print(f"{expression(node):<12} matches: {matched!s:<5}",
              {name: expression(n) for name, n in bindings.items()})
    """)
    b.md("""
    A name used twice must bind the same node both times — that is how `x + x` is recognised
    (hash-consing makes "the same node" a cheap identity check):
    """)
    b.code("""
    doubled = UPat(Ops.ADD, src=(UPat.var("x"), UPat.var("x")))
    print(doubled.match(i + i, {}), doubled.match(i + j, {}))
    """)
    b.md("""
    ## A pattern matcher and `graph_rewrite`

    A rule is `(name, pattern, build)`: when the pattern matches, `build(**bindings)` returns the
    replacement (or `None` for "no change after all"). `graph_rewrite` rebuilds the graph from
    the leaves up; at each node it applies the first matching rule, rewrites the result again,
    and stops when no rule matches anywhere.
    """)
    b.code("""
    x = UPat.var("x")
    tidy = PatternMatcher("tidy", [
        ("x+x -> x*2", UPat(Ops.ADD, src=(x, x)), lambda x: x * 2),
        ("x*1 -> x", UPat(Ops.MUL, src=(x, UPat.const(1))), lambda x: x),
    ])
    before = (i * 1 + i * 1) + j
    after = graph_rewrite(before, tidy)
    print(expression(before), "->", expression(after))
    assert after is i * 2 + j
    """)
    b.md("""
    Note the order of events: `i*1` became `i` first (sources are rewritten before their users),
    which made the two sources of the `ADD` the *same node*, which let `x+x` fire. UOps are
    immutable: `before` is untouched, and `after` is a new graph that shares every unchanged node.

    ## Constant folding

    `symbolic` is tinyteach's simplifier. Its first rule folds any ALU op whose sources are all
    constants, using the Python reference semantics in `PYTHON_ALU` (C's integer division, with
    the dtype's wrap-around):
    """)
    b.code("""
    c = UOp.const(dtypes.int32, 7)
    folded = graph_rewrite((c * 6 - 2) // -4, symbolic)
    print(folded)
    assert folded.arg == int((7 * 6 - 2) / -4)    # truncates toward zero: -10, not -10.0 floor
    big = graph_rewrite(UOp.const(dtypes.int8, 100) + 100, symbolic)
    print(big, "(int8 wraps around)")
    assert big.arg == np.int8(np.array(200).astype(np.int8))
    """)
    b.md("""
    ## The symbolic rules

    Here is the whole table, by name. Apart from folding, most rules are algebra on *integer*
    index arithmetic; several only hold for non-negative values, which is where `vmin`/`vmax`
    (chapter 3) come in.
    """)
    b.code("""
    for name, _, _ in symbolic.rules:
        print(" ", name)
    """)
    b.md("""
    The showcase rule: `(a*c + b) // c -> a + b // c`, and `b // c -> 0` when `0 ≤ b < c`. With
    `0 ≤ gidx1 < 8`:
    """)
    b.code("""
    for e in [(i * 8 + j) // 8, (i * 8 + j) % 8, (i * 8 + j) // 8 % 4, (i * 16 + j * 2 + 1) // 8,
              (i * 8 + j).lt(32)]:
        print(f"{expression(e):<28} -> {expression(graph_rewrite(e, symbolic))}")
    """)
    b.md("""
    A simplification must never change a value. Check each one by evaluating both sides for every
    `(gidx0, gidx1)` in range:
    """)
    b.code("""
    import itertools
    from tinyteach.rewrite import PYTHON_ALU

    def evaluate(node: UOp, env: dict[UOp, int]):
        if node.op is Ops.RANGE:
            return env[node]
        if node.op is Ops.CONST:
            return node.arg
        return PYTHON_ALU[node.op](*(evaluate(s, env) for s in node.src))

    def same_everywhere(a: UOp, b: UOp) -> bool:
        return all(evaluate(a, {i: vi, j: vj}) == evaluate(b, {i: vi, j: vj})
                   for vi, vj in itertools.product(range(4), range(8)))

    for e in [(i * 8 + j) // 8 % 4, (i * 16 + j * 2 + 1) // 8, (i * 8 + j) % 8, (i * 10 + j) % 4]:
        assert same_everywhere(e, graph_rewrite(e, symbolic))
    print("all simplifications keep their values")
    """)
    b.md("""
    ## Recording rewrites

    `with record_rewrites() as log:` records every rule that fired inside the block, with the
    node before and after. (`DEBUG=5` prints the same steps as they happen.)
    """)
    b.code("""
    from tinyteach.view import index_into_buffer
    base = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    view = base.reshape(12).reshape(3, 4).permute(1, 0)      # chapter 4's clumsy round trip
    k0, k1 = (UOp(Ops.RANGE, dtypes.int32, (), ("g", n, s)) for n, s in enumerate(view.shape))
    _, position, _ = index_into_buffer(view.uop, (k0, k1))
    with record_rewrites() as log:
        simplified = graph_rewrite(position, symbolic)
    print(steps_text(log.steps))
    """)
    b.md("""
    `viz.rewrites` turns a log into an explorer: a slider (and ◀ ▶ buttons) over the steps,
    showing the rule's name, the formula before and after, and the two small graphs side by
    side. (Widgets need a live kernel; in a static view, the line of text below the widget is
    what you see.)
    """)
    b.code("""
    viz.rewrites(log)
    """)
    b.md("""
    Given a Tensor instead of a log, `viz.rewrites` lowers the tensor's kernels (chapter 7) while
    recording — nothing runs — so you can see what the simplifier did to a real kernel's index
    math. The text list of the same steps — notice where it stops: `((x//4)*4) + (x%4)` is just
    `x`, but no rule says so (exercise 3):
    """)
    b.code("""
    out = base.reshape(2, 6).permute(1, 0).sum(1)
    from viz.rewrites import collect_steps
    steps = collect_steps(out)
    print(steps_text(steps))
    viz.rewrites(out)
    """)
    b.md("""
    ## Rules that never finish

    Nothing stops a table from containing rules that undo each other — the pattern matcher
    cannot know. `graph_rewrite` counts its steps and stops with an error instead of looping
    forever:
    """)
    b.code("""
    a, y = UPat.var("a"), UPat.var("y")
    flip_flop = PatternMatcher("flip-flop", [
        ("a+y -> y+a", UPat(Ops.ADD, src=(a, y)), lambda a, y: y + a if a is not y else None),
    ])
    try:
        graph_rewrite(i + j, flip_flop, max_steps=50)
    except RuntimeError as error:
        print("RuntimeError:", error)
    """)
    b.md("""
    Why does it loop? `y + a` is a new node (hash-consing keeps `i+j` and `j+i` apart), and
    `ADD` is commutative, so the pattern matches it again — forever. The fix in practice is a canonical order: `symbolic` has `c+x -> x+c`
    (constants to the right) but never a rule that moves them back.

    ## Try it

    1. Add a rule `x*2 -> x+x` to a new `PatternMatcher` and apply it to `(i*2)*2`. What comes
       out, and why is it not `i+i+i+i`?
    2. Write a rule that folds `x + (-x)` to `0` for integers, and check it with `same_everywhere`.
    3. `(k//4)*4 + k%4` equals `k` (for C's division, for any `k`). `symbolic` knows this through
       its rule "(x//c)*c + x%c -> x" (`recombine_divmod` in rewrite.py, which also finds the two
       terms inside longer sums). Write the two-term version as one `UPat`, check it on its own
       (no `symbolic`), and check that `Tensor.ones(3, 4).reshape(12)` reads its buffer at
       position `gidx0`.
    """)
    b.solution(1, """
    double = PatternMatcher("double", [("x*2 -> x+x", UPat(Ops.MUL, src=(x, UPat.const(2))),
                                        lambda x: x + x)])
    result = graph_rewrite((i * 2) * 2, double)
    # the inner i*2 becomes i+i first; then (i+i)*2 becomes (i+i)+(i+i): one shared node
    print(expression(result))
    assert result is (i + i) + (i + i)
    """)
    b.solution(2, """
    cancel = PatternMatcher("cancel", [
        ("x+(-x) -> 0", UPat(Ops.ADD, src=(x, UPat(Ops.NEG, src=(x,)))),
         lambda x: UOp.const(x.dtype, 0) if dtypes.is_int(x.dtype) else None)])
    e = (i * 3 + j) - (i * 3 + j)
    zero = graph_rewrite(e, cancel)
    assert zero.op is Ops.CONST and zero.arg == 0 and same_everywhere(e, zero)
    print(expression(e), "->", expression(zero))
    """)
    b.solution(3, """
    c = UPat.cvar("c")      # bound twice: both must be the same constant node
    div_mod = PatternMatcher("div-mod", [
        ("x//c*c + x%c -> x",
         UPat(Ops.ADD, src=(UPat(Ops.MUL, src=(UPat(Ops.IDIV, src=(x, c)), c)),
                            UPat(Ops.MOD, src=(x, c)))),
         lambda x, c: x if c.arg != 0 else None)])
    k = UOp(Ops.RANGE, dtypes.int32, (), ("g", 0, 12))
    e = (k // 4) * 4 + k % 4
    assert graph_rewrite(e, div_mod) is k and graph_rewrite(e, symbolic) is k

    flat_view = Tensor.ones(3, 4).contiguous().realize().reshape(12)
    _, position, _ = index_into_buffer(flat_view.uop, (k,))
    print("symbolic:          ", expression(graph_rewrite(position, symbolic)))
    print("symbolic + div_mod:", expression(graph_rewrite(position, symbolic + div_mod)))
    assert graph_rewrite(position, symbolic + div_mod) is k
    """)
    return b
