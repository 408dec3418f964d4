"""Chapter 8: code generation — a linear program becomes source code.

What this teaches:
- a renderer walks the linear program once, giving each value a name and each op a snippet of
  source: `code_for_op[Ops.ADD] = lambda a, b: f"({a}+{b})"`. C, OpenCL C, CUDA C and WGSL
  differ in a handful of places (how a kernel and its parameters are declared, type names, how
  loops and constants are written), so one `CStyleRenderer` serves them all, with small
  subclasses;
- values used once are written inline (`data0[i] = (val0+val1)`), values used more than once get
  a name (`alu0`), loads always get one (`val0`), so the code reads like a person wrote it.

Builds on: uop.py, lower.py (LinearProgram). Used by: the compiled runtimes (runtime/cpu.py, ...).
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

from tinyteach.dtype import DType, dtypes
from tinyteach.lower import LinearProgram
from tinyteach.uop import ALU, Ops, UOp

# values written inline where they are used, when they are used once
INLINE_OPS = set(ALU) | {Ops.CONST}


def _max_code(a: str, b: str, dtype: DType) -> str:
    if dtypes.is_float(dtype):
        return f"(({a}>{b}||{a}!={a})?{a}:{b})"  # NaN wins, as in numpy's maximum
    return f"({a}>{b}?{a}:{b})"


def _idiv_code(a: str, b: str, dtype: DType, b_node: UOp) -> str:
    if b_node.op is Ops.CONST and b_node.arg not in (0, -1):
        return f"({a}/{b})"
    if dtypes.is_unsigned(dtype):
        return f"({b}==0?0:{a}/{b})"
    return f"({b}==0?0:({b}==-1?-{a}:{a}/{b}))"  # never trap: x/0 -> 0, MIN/-1 wraps


def _mod_code(a: str, b: str, dtype: DType, b_node: UOp) -> str:
    if b_node.op is Ops.CONST and b_node.arg not in (0, -1):
        return f"({a}%{b})"
    if dtypes.is_unsigned(dtype):
        return f"({b}==0?0:{a}%{b})"
    return f"(({b}==0||{b}==-1)?0:{a}%{b})"


def _logic(symbol_bool: str, symbol_int: str) -> Callable[[str, str, DType], str]:
    def code(a: str, b: str, dtype: DType) -> str:
        return f"({a}{symbol_bool if dtype == dtypes.bool else symbol_int}{b})"
    return code


class CStyleRenderer:
    """Renders a LinearProgram in a C-like language. Subclasses change the details."""

    device = "C"
    kernel_prefix = ""
    type_names: dict[DType, str] = {
        dtypes.bool: "bool", dtypes.int8: "signed char", dtypes.uint8: "unsigned char",
        dtypes.int16: "short", dtypes.uint16: "unsigned short", dtypes.int32: "int",
        dtypes.uint32: "unsigned int", dtypes.int64: "long long",
        dtypes.uint64: "unsigned long long", dtypes.float16: "half", dtypes.float32: "float",
        dtypes.float64: "double",
    }
    math_functions = {Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.SQRT: "sqrt"}
    infinity, nan = "INFINITY", "NAN"

    def __init__(self) -> None:
        self.code_for_op: dict[Ops, Callable[..., str]] = {
            Ops.NEG: lambda a, dtype: f"(!{a})" if dtype == dtypes.bool else f"(-{a})",
            Ops.RECIPROCAL: lambda a, dtype: f"({self.render_const(1, dtype)}/{a})",
            Ops.CAST: lambda a, dtype: f"(({self.type_name(dtype)})({a}))",
            Ops.ADD: lambda a, b, dtype: f"({a}+{b})",
            Ops.MUL: lambda a, b, dtype: f"({a}*{b})",
            Ops.MAX: _max_code,
            Ops.CMPLT: lambda a, b, dtype: f"({a}<{b})",
            Ops.CMPNE: lambda a, b, dtype: f"({a}!={b})",
            Ops.AND: _logic("&&", "&"), Ops.OR: _logic("||", "|"), Ops.XOR: _logic("!=", "^"),
            Ops.WHERE: lambda c, a, b, dtype: f"({c}?{a}:{b})",
        }
        for op in self.math_functions:
            self.code_for_op[op] = self._math_function(op)

    def _math_function(self, op: Ops) -> Callable[[str, DType], str]:
        def code(a: str, dtype: DType) -> str:
            return f"{self.math_functions[op]}({a})"
        return code

    # ---- the pieces a language changes ----

    def type_name(self, dtype: DType) -> str:
        return self.type_names[dtype]

    def render_const(self, value: float | int | bool, dtype: DType) -> str:
        if dtypes.is_float(dtype):
            if math.isnan(value):
                return self.nan
            if math.isinf(value):
                return self.infinity if value > 0 else f"-{self.infinity}"
            return self.float_literal(float(value), dtype)
        if dtype == dtypes.bool:
            return "1" if value else "0"
        return self.int_literal(int(value), dtype)

    def float_literal(self, value: float, dtype: DType) -> str:
        text = repr(value)
        return text if dtype == dtypes.float64 else f"{text}f"

    def int_literal(self, value: int, dtype: DType) -> str:
        suffix = {dtypes.int64: "ll", dtypes.uint64: "ull", dtypes.uint32: "u"}.get(dtype, "")
        if value == dtype.min and value < 0:
            return f"({value + 1}{suffix}-1)"  # -2147483648 is not a valid C literal
        return f"{value}{suffix}"

    def render_kernel(self, name: str, params: list[str], body: list[str]) -> str:
        raise NotImplementedError

    def param(self, define: UOp, is_output: bool) -> str:
        raise NotImplementedError

    def loop(self, name: str, size: int) -> str:
        return f"for (int {name} = 0; {name} < {size}; {name}++) {{"

    def declare(self, name: str, dtype: DType, value: str) -> str:
        return f"{self.type_name(dtype)} {name} = {value};"

    def load(self, buffer: str, index: str) -> str:
        return f"{buffer}[{index}]"

    def store(self, buffer: str, index: str, value: str) -> str:
        return f"{buffer}[{index}] = {value};"

    def alu(self, node: UOp, operands: list[str]) -> str:
        if node.op in (Ops.IDIV, Ops.MOD):
            code = _idiv_code if node.op is Ops.IDIV else _mod_code
            return code(operands[0], operands[1], node.dtype, node.src[1])
        if node.op is Ops.CAST:
            return self.code_for_op[Ops.CAST](operands[0], node.dtype)
        if node.op in (Ops.CMPLT, Ops.CMPNE, Ops.WHERE, Ops.MAX, Ops.AND, Ops.OR, Ops.XOR):
            return self.code_for_op[node.op](*operands, node.src[-1].dtype)
        return self.code_for_op[node.op](*operands, node.dtype)

    # ---- the walk over the program ----

    def render(self, name: str, program: LinearProgram) -> str:
        uses = Counter(s for u in program.uops for s in u.src)
        names: dict[UOp, str] = {}
        counters: Counter[str] = Counter()
        body: list[str] = []
        depth = 1

        def new_name(prefix: str) -> str:
            counters[prefix] += 1
            return f"{prefix}{counters[prefix] - 1}"

        for u in program.uops:
            operands = [names.get(s, "") for s in u.src]
            line = None
            if u.op is Ops.DEFINE_GLOBAL:
                names[u] = f"data{u.arg[0]}"
            elif u.op is Ops.CONST:
                names[u] = self.render_const(u.arg, u.dtype)
            elif u.op is Ops.RANGE:
                names[u] = f"{'gidx' if u.arg[0] == 'g' else 'ridx'}{u.arg[1]}"
                body.append("  " * depth + self.loop(names[u], u.arg[2]))
                depth += 1
            elif u.op is Ops.END_RANGE:
                depth -= 1
                line = "}"
            elif u.op is Ops.LOAD:
                value = self.load(operands[0], operands[1])
                if len(u.src) == 3:  # guarded: padding outside the buffer reads 0
                    value = f"({operands[2]}?{value}:{self.render_const(0, u.dtype)})"
                names[u] = new_name("val")
                line = self.declare(names[u], u.dtype, value)
            elif u.op is Ops.DEFINE_ACC:
                names[u] = new_name("acc")
                line = self.declare(names[u], u.dtype, operands[0])
            elif u.op is Ops.ACCUMULATE:
                acc, value = u.src
                combined = (f"({names[acc]}+{operands[1]})" if u.arg is Ops.ADD
                            else _max_code(names[acc], operands[1], u.dtype))
                line = f"{names[acc]} = {combined};"
            elif u.op is Ops.REDUCE:
                names[u] = names[program.accumulators[u]]
            elif u.op is Ops.STORE:
                line = self.store(operands[0], operands[1], operands[2])
            elif u.op in ALU:
                expression = self.alu(u, operands)
                if uses[u] <= 1:
                    names[u] = expression
                else:
                    names[u] = new_name("alu")
                    line = self.declare(names[u], u.dtype, expression)
            else:
                raise NotImplementedError(f"{type(self).__name__} cannot render {u.op.name}")
            if line is not None:
                body.append("  " * depth + line)
        params = [self.param(g, g.arg[0] == 0) for g in program.globals]
        return self.render_kernel(name, params, body)
