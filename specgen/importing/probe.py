"""Symbolic sizes from example inputs, by running the target on other shapes.

Sizes that are equal in the examples are candidates for one symbol, never merged on sight:
each is changed alone (then in pairs) and the target is run again. Sizes that can change
alone are separate symbols (and flagged when they were equal in the example); sizes the
target refuses to see differ share a symbol (flagged too); a size that can change only
with another at a fixed ratio becomes `S/k`; one that cannot change at all is a literal.
Output sizes are fitted as `S*mul/div + add` from runs at two other values of each symbol.

Runs go through meta tensors (shapes only, free at any size) when the target agrees with
its real run on the examples there, else through real CPU tensors.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from fractions import Fraction

import torch

from ..errors import Rejected
from .target import Callee


class ImportRefused(Rejected):
    """The target does something a spec cannot say (exit 1)."""


@dataclass(frozen=True)
class Position:
    arg: str
    axis: int
    size: int

    def __str__(self) -> str:
        return f"{self.arg}.shape[{self.axis}]"


@dataclass
class Symbol:
    value: int  # the example value
    uses: list[tuple[Position, int, int]]  # (position, mul, div): size = value * mul / div
    name: str = ""
    lo: int = 1
    hi: int = 1

    @property
    def step(self) -> int:
        """The multiple the symbol must be so every `S*mul/div` is whole."""
        step = 1
        for _, mul, div in self.uses:
            step = math.lcm(step, div // math.gcd(div, mul))
        return step

    def sizes(self, value: int) -> dict[Position, int]:
        return {p: value * mul // div for p, mul, div in self.uses}


@dataclass
class Shapes:
    """What probing found: symbols, fixed sizes, output dims and notes for the user."""

    symbols: list[Symbol]
    fixed: list[Position]
    outputs: list[list[tuple[Symbol | None, int, int, int]]]  # per output axis: (symbol, mul, div, add)
    flags: list[str] = field(default_factory=list)

    def dim_of(self, position: Position) -> tuple[Symbol | None, int, int]:
        for symbol in self.symbols:
            for p, mul, div in symbol.uses:
                if p == position:
                    return symbol, mul, div
        return None, 1, 1


def as_tuple(value) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


class Runner:
    """Runs a Callee on tensors of chosen shapes (and dtypes); a failure is None, never raised."""

    def __init__(self, callee: Callee):
        self.callee = callee
        self.tensors = {a.name: a.value for a in callee.arguments if isinstance(a.value, torch.Tensor)}
        self.others = {a.name: a.value for a in callee.arguments if not isinstance(a.value, torch.Tensor)}
        self.last_error: str | None = None
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                outputs = as_tuple(callee.call(**self.tensors, **self.others))
            except Exception as error:  # the user's code, on the user's own examples
                raise ImportRefused(f"{callee.target.description}: it fails on its example inputs: "
                                    f"{type(error).__name__}: {error}") from None
        bad = [type(o).__name__ for o in outputs if not isinstance(o, torch.Tensor)]
        if bad:
            raise ImportRefused(f"{callee.target.description}: it returns {', '.join(bad)}; a spec's outputs are "
                                f"tensors (return a tensor or a tuple of tensors)")
        self.example_outputs = outputs
        self.mode = "real"
        meta = self.run({name: tuple(t.shape) for name, t in self.tensors.items()}, device="meta")
        if meta is not None and [tuple(o.shape) for o in meta] == [tuple(o.shape) for o in outputs]:
            self.mode = "meta"

    def tensor(self, name: str, shape: tuple, dtype: torch.dtype | None, device: str) -> torch.Tensor:
        example = self.tensors[name]
        dtype = dtype or example.dtype
        if device == "meta":
            return torch.empty(shape, dtype=dtype, device="meta")
        if dtype.is_floating_point:
            return torch.randn(shape, dtype=torch.float64).to(dtype)
        if dtype == torch.bool:
            return torch.zeros(shape, dtype=torch.bool)
        fill = int(example.min()) if example.numel() else 0
        return torch.full(shape, fill, dtype=dtype)

    def run(self, shapes: dict[str, tuple], *, dtypes: dict[str, torch.dtype] | None = None,
            device: str | None = None, values: dict[str, torch.Tensor] | None = None):
        device = device or self.mode
        device = "meta" if device == "meta" else "cpu"
        try:
            args = {name: (values or {}).get(name) if name in (values or {}) else
                    self.tensor(name, shape, (dtypes or {}).get(name), device) for name, shape in shapes.items()}
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return as_tuple(self.callee.call(**args, **self.others))
        except Exception as error:  # a refused shape is an answer, not a failure
            self.last_error = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            return None

    def shapes_with(self, sizes: dict[Position, int]) -> dict[str, tuple]:
        shapes = {name: list(t.shape) for name, t in self.tensors.items()}
        for position, size in sizes.items():
            shapes[position.arg][position.axis] = size
        return {name: tuple(shape) for name, shape in shapes.items()}

    def output_shapes(self, sizes: dict[Position, int]) -> list[tuple] | None:
        outputs = self.run(self.shapes_with(sizes))
        return None if outputs is None else [tuple(o.shape) for o in outputs]

    def ok(self, sizes: dict[Position, int]) -> bool:
        return self.output_shapes(sizes) is not None


def bump(value: int, step: int = 1) -> int:
    """Another size keeping small power-of-two divisibility (4096 -> 4160, 1000 -> 1008)."""
    return value + step * math.gcd(max(value // step, 1), 64)


def _partition(runner: Runner, group: list[Position]) -> list[list[Position]]:
    """Split positions of one example size into the sets that must change together."""
    size = group[0].size
    new = bump(size)
    rest, parts = list(group), []
    if len(rest) > 1:
        for p in list(rest):
            if runner.ok({p: new}):
                parts.append([p])
                rest.remove(p)
    while rest:
        first = rest[0]
        part = None
        if len(rest) > 2:
            for other in rest[1:]:
                if runner.ok({first: new, other: new}):
                    part = [first, other]
                    break
        part = part or list(rest)
        for p in part:
            rest.remove(p)
        parts.append(part)
    return parts


def find_symbols(runner: Runner, positions: list[Position]) -> tuple[list[Symbol], list[Position], list[str]]:
    flags: list[str] = []
    groups: dict[int, list[Position]] = {}
    for p in positions:
        groups.setdefault(p.size, []).append(p)
    free: list[Symbol] = []
    stuck: list[list[Position]] = []
    coincident: list[list[Symbol]] = []
    for size, group in groups.items():
        here = []
        for part in _partition(runner, group):
            if runner.ok({p: bump(size) for p in part}):
                symbol = Symbol(size, [(p, 1, 1) for p in part])
                free.append(symbol)
                here.append(symbol)
            else:
                stuck.append(part)
        if len(here) > 1:
            coincident.append(here)
    # a set that cannot change alone may change with another at a fixed ratio (x: 2*H, w: H)
    fixed: list[Position] = []
    while stuck:
        part = stuck.pop(0)
        a = part[0].size
        merged = False
        for other in list(stuck):
            b = other[0].size
            big, small = (part, other) if a > b else (other, part)
            if a == b or big[0].size % small[0].size:
                continue
            k = big[0].size // small[0].size
            new_small = bump(small[0].size)
            if runner.ok({**{p: new_small * k for p in big}, **{p: new_small for p in small}}):
                stuck.remove(other)
                free.append(Symbol(big[0].size, [(p, 1, 1) for p in big] + [(p, 1, k) for p in small]))
                merged = True
                break
        if not merged:
            for symbol in free:
                b = symbol.value
                if a == b or (a % b and b % a):
                    continue
                mul, div = (a // b, 1) if a > b else (1, b // a)
                if symbol.step > 1 or div > 1 and bump(b, div) % div:
                    continue
                new = bump(b, div)
                if runner.ok({**symbol.sizes(new), **{p: new * mul // div for p in part}}):
                    symbol.uses += [(p, mul, div) for p in part]
                    merged = True
                    break
        if not merged:
            fixed += part
    for group in coincident:
        flags.append(("{names}: " + " and ".join(
            f"{_where(s)}" for s in group) + f" were {'both' if len(group) == 2 else 'all'} {group[0].value} in the example inputs; the reference runs "
                      f"with them different, so they are separate symbols: make them one symbol if they must be "
                      f"equal").replace("{names}", "{" + ",".join(str(id(s)) for s in group) + "}"))
    for symbol in free:
        plain = [p for p, mul, div in symbol.uses if (mul, div) == (1, 1)]
        if len(plain) > 1:
            flags.append("{" + str(id(symbol)) + "}: " + " and ".join(str(p) for p in plain)
                         + f" were {'both' if len(plain) == 2 else 'all'} {symbol.value} in the example inputs and the reference fails when they "
                           f"differ, so they share one symbol: confirm they must be equal")
        for p, mul, div in symbol.uses:
            if (mul, div) != (1, 1):
                flags.append("{" + str(id(symbol)) + "}: " + f"{p} is {symbol.value * mul // div}, and the reference "
                             f"runs only when it keeps that ratio to {_where(symbol)}: confirm the relation")
    for p in fixed:
        flags.append(f"{p} is fixed at {p.size}: the reference failed with other sizes "
                     f"({runner.last_error or 'no detail'})")
    return free, fixed, flags


def _where(symbol: Symbol) -> str:
    return " and ".join(str(p) for p, mul, div in symbol.uses if (mul, div) == (1, 1)) or str(symbol.uses[0][0])


def find_range(runner: Runner, symbol: Symbol) -> tuple[int, int, str | None]:
    """(lo, hi, flag): the smallest size the reference takes, and a power-of-two ceiling."""
    step = symbol.step
    hi = max(symbol.value, 1 << max(symbol.value - 1, 0).bit_length())
    for k in (1, 2, 3, 4, 8, 16, 32, 64):
        value = k * step
        if value >= symbol.value:
            break
        if runner.ok(symbol.sizes(value)):
            flag = None if k == 1 else (f"{{{id(symbol)}}}: sizes below {value} fail in the reference, so its range "
                                        f"starts at {value}: check which sizes it really takes")
            return value, hi, flag
    if symbol.value > step:
        return symbol.value, hi, (f"{{{id(symbol)}}}: the reference fails at every size below its example "
                                  f"{symbol.value}, so its range starts there")
    return symbol.value, hi, None


def fit_outputs(runner: Runner, symbols: list[Symbol]) -> list[list[tuple[Symbol | None, int, int, int]]]:
    base = [tuple(o.shape) for o in runner.example_outputs]
    runs: dict[int, list[tuple[int, list[tuple]]]] = {}
    for symbol in symbols:
        points = []
        for value in (bump(symbol.value, symbol.step), bump(bump(symbol.value, symbol.step), symbol.step)):
            shapes = runner.output_shapes(symbol.sizes(value))
            if shapes is None:
                raise ImportRefused(f"the reference failed when {_where(symbol)} changed to {value} "
                                    f"({runner.last_error})")
            points.append((value, shapes))
        runs[id(symbol)] = points
    result = []
    for index, shape in enumerate(base):
        axes = []
        for axis, size in enumerate(shape):
            moved = [s for s in symbols if any(len(p[1][index]) != len(shape) or p[1][index][axis] != size
                                               for p in runs[id(s)])]
            if not moved:
                axes.append((None, 1, 1, size))
                continue
            if len(moved) > 1:
                raise ImportRefused(f"output {index} axis {axis} changes with " + " and ".join(_where(s) for s in moved)
                                    + ": a size made of several symbols (e.g. a reshape that merges them) has no "
                                      "spelling in the signature language; wrap the reference to keep them apart")
            symbol = moved[0]
            (v1, s1), (v2, s2) = runs[id(symbol)]
            if any(len(s[index]) != len(shape) for s in (s1, s2)):
                raise ImportRefused(f"output {index} changes its number of dims with {_where(symbol)}")
            slope = Fraction(s1[index][axis] - size, v1 - symbol.value)
            add = size - slope * symbol.value
            if slope <= 0 or add.denominator != 1 or s2[index][axis] != slope * v2 + add:
                raise ImportRefused(f"output {index} axis {axis} follows {_where(symbol)} in a way the signature "
                                    f"language cannot write (sizes {size}, {s1[index][axis]}, {s2[index][axis]} for "
                                    f"{symbol.value}, {v1}, {v2}); it takes S, k*S, S/k and S+c")
            axes.append((symbol, slope.numerator, slope.denominator, int(add)))
        result.append(axes)
    return result


def probe_shapes(runner: Runner) -> Shapes:
    positions = [Position(name, axis, size) for name, t in runner.tensors.items() for axis, size in enumerate(t.shape)]
    symbols, fixed, flags = find_symbols(runner, positions)
    for symbol in symbols:
        symbol.lo, symbol.hi, flag = find_range(runner, symbol)
        if flag:
            flags.append(flag)
    outputs = fit_outputs(runner, symbols)
    return Shapes(symbols, fixed, outputs, flags)
