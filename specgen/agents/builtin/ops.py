"""The row-program IR's elementwise ops, one table: each op's arity, the C expression the emitter
writes for it and the torch function the CPU interpreter evaluates it with (one meaning in both).
Ops whose C depends on more than their operands (div, floordiv, pow, cast: the node's dtype and
arguments decide) have no template: the emitter's own rule (emit.op_expr)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class OpDef:
    arity: int
    c: str | None  # C text with {0}, {1}, {2} for the operands (acc_t: the math type, T: the storage type)
    torch: Callable | None  # the interpreter's evaluation (None: its own rule)


def _floordiv(a, b):
    return torch.div(a, b, rounding_mode="floor")


OPS: dict[str, OpDef] = {
    # unary: exp, tanh, expm1 and log1p by the storage dtype T (fast forms for 16-bit storage: prelude)
    "neg": OpDef(1, "(-{0})", torch.neg),
    "exp": OpDef(1, "sg::exp_<T>((acc_t)({0}))", torch.exp),
    "log": OpDef(1, "sg::log_((acc_t)({0}))", torch.log),
    "tanh": OpDef(1, "sg::tanh_<T>((acc_t)({0}))", torch.tanh),
    "rsqrt": OpDef(1, "sg::rsqrt_((acc_t)({0}))", torch.rsqrt),
    "sqrt": OpDef(1, "sg::sqrt_((acc_t)({0}))", torch.sqrt),
    "abs": OpDef(1, "fabs((acc_t)({0}))", torch.abs),
    "sigmoid": OpDef(1, "((acc_t)1 / ((acc_t)1 + sg::exp_<T>(-(acc_t)({0}))))", torch.sigmoid),
    "erf": OpDef(1, "sg::erf_((acc_t)({0}))", torch.erf),
    "log1p": OpDef(1, "sg::log1p_<T>((acc_t)({0}))", torch.log1p),
    "expm1": OpDef(1, "sg::expm1_<T>((acc_t)({0}))", torch.expm1),
    "reciprocal": OpDef(1, "((acc_t)1 / (acc_t)({0}))", torch.reciprocal),
    "sin": OpDef(1, "sin((acc_t)({0}))", torch.sin),
    "cos": OpDef(1, "cos((acc_t)({0}))", torch.cos),
    "not": OpDef(1, "(!{0})", torch.logical_not),
    "exp2": OpDef(1, "exp2((acc_t)({0}))", torch.exp2),
    "log2": OpDef(1, "log2((acc_t)({0}))", torch.log2),
    "log10": OpDef(1, "log10((acc_t)({0}))", torch.log10),  # decibels: 10 * log10(power)
    "floor": OpDef(1, "floor((acc_t)({0}))", torch.floor),
    "ceil": OpDef(1, "ceil((acc_t)({0}))", torch.ceil),
    # rint rounds half to even in the default rounding mode, as torch.round does (fake quantization)
    "round": OpDef(1, "rint((acc_t)({0}))", torch.round),
    "trunc": OpDef(1, "trunc((acc_t)({0}))", torch.trunc),
    "tan": OpDef(1, "tan((acc_t)({0}))", torch.tan),
    "atan": OpDef(1, "atan((acc_t)({0}))", torch.atan),
    "asin": OpDef(1, "asin((acc_t)({0}))", torch.asin),
    "acos": OpDef(1, "acos((acc_t)({0}))", torch.acos),
    "sinh": OpDef(1, "sinh((acc_t)({0}))", torch.sinh),
    "cosh": OpDef(1, "cosh((acc_t)({0}))", torch.cosh),
    "asinh": OpDef(1, "asinh((acc_t)({0}))", torch.asinh),
    "acosh": OpDef(1, "acosh((acc_t)({0}))", torch.acosh),
    "atanh": OpDef(1, "atanh((acc_t)({0}))", torch.atanh),
    "sign": OpDef(1, "(acc_t)(((acc_t)0 < (acc_t)({0})) - ((acc_t)({0}) < (acc_t)0))", torch.sign),
    "isfinite": OpDef(1, "isfinite((acc_t)({0}))", torch.isfinite),  # bool: optimize.centered_affine's guard
    "signbit": OpDef(1, "signbit((acc_t)({0}))", torch.signbit),  # bool: torch.div(rounding_mode="floor") of ints
    # binary
    "add": OpDef(2, "({0} + {1})", torch.add),
    "sub": OpDef(2, "({0} - {1})", torch.sub),
    "mul": OpDef(2, "({0} * {1})", torch.mul),
    "div": OpDef(2, None, None),  # int: truncating; float: a per-row divisor as a reciprocal (emit.div_per_row)
    "floordiv": OpDef(2, None, _floordiv),  # sizes: non-negative
    "pow": OpDef(2, None, torch.pow),  # squares and cubes as products
    "maximum": OpDef(2, "sg::max_((acc_t)({0}), (acc_t)({1}))", torch.maximum),
    "minimum": OpDef(2, "sg::min_((acc_t)({0}), (acc_t)({1}))", torch.minimum),
    "eq": OpDef(2, "({0} == {1})", torch.eq),
    "ne": OpDef(2, "({0} != {1})", torch.ne),
    "lt": OpDef(2, "({0} < {1})", torch.lt),
    "le": OpDef(2, "({0} <= {1})", torch.le),
    "gt": OpDef(2, "({0} > {1})", torch.gt),
    "ge": OpDef(2, "({0} >= {1})", torch.ge),
    "and": OpDef(2, "({0} && {1})", torch.logical_and),
    "or": OpDef(2, "({0} || {1})", torch.logical_or),
    "atan2": OpDef(2, "atan2((acc_t)({0}), (acc_t)({1}))", torch.atan2),
    "fmod": OpDef(2, "fmod((acc_t)({0}), (acc_t)({1}))", torch.fmod),
    "remainder": OpDef(2, None, torch.remainder),  # Python's %: the divisor's sign (emit.op_expr, by dtype)
    # ternary and conversions
    "where": OpDef(3, "({0} ? {1} : {2})", torch.where),
    "cast": OpDef(1, None, None),  # by the node's dtype
}
UNARY = frozenset(name for name, op in OPS.items() if op.arity == 1 and name != "cast")
BINARY = frozenset(name for name, op in OPS.items() if op.arity == 2)
