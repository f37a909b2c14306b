"""The signature mini-language: `op(x: Tensor[N, D], eps: float = 1e-5) -> Tensor[N, D]`.

Parsed into small immutable objects that print back to the same canonical text, so
`parse_signature(str(sig)) == sig` (property-tested). A `SignatureSyntaxError` carries the
0-based offset of the offending character; spec.py turns it into file:line:column.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
INT_DTYPES = ("int64", "int32", "int16", "int8", "uint8")
TENSOR_DTYPES = FLOAT_DTYPES + INT_DTYPES + ("bool",)
SCALAR_TYPES = ("float", "int", "bool")
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class SignatureSyntaxError(ValueError):
    def __init__(self, message: str, offset: int, text: str):
        self.message = message
        self.offset = offset
        self.text = text
        super().__init__(f"{message} (at character {offset + 1})")

    def caret(self) -> str:
        """The signature with a caret under the offending character."""
        return f"{self.text}\n{' ' * self.offset}^"


# ---------------------------------------------------------------------------- dims

@dataclass(frozen=True)
class Dim:
    """One size: a literal (`symbol is None`, the value is `add`) or `symbol*mul/div + add`."""

    symbol: str | None = None
    mul: int = 1
    div: int = 1
    add: int = 0

    @staticmethod
    def literal(value: int) -> "Dim":
        return Dim(None, 1, 1, value)

    @property
    def is_literal(self) -> bool:
        return self.symbol is None

    @property
    def is_plain_symbol(self) -> bool:
        return self.symbol is not None and (self.mul, self.div, self.add) == (1, 1, 0)

    def resolve(self, dims: dict[str, int]) -> int:
        if self.symbol is None:
            return self.add
        value = dims[self.symbol] * self.mul
        if value % self.div:
            raise ValueError(f"{self}: {self.symbol}={dims[self.symbol]} is not divisible as {self} needs")
        return value // self.div + self.add

    def invert(self, size: int) -> int | None:
        """The symbol's value that gives `size`, or None when no integer does."""
        if self.symbol is None:
            return None
        scaled = (size - self.add) * self.div
        if scaled % self.mul:
            return None
        return scaled // self.mul

    def c_expr(self, prefix: str = "") -> str:
        """The size as a C/C++ integer expression over the resolved symbols (`prefix` names
        where they live, e.g. "A." for the ABI struct)."""
        if self.symbol is None:
            return str(self.add)
        text = f"{prefix}{self.symbol}"
        if self.mul != 1:
            text = f"{text} * {self.mul}"
        if self.div != 1:
            text = f"({text}) / {self.div}"
        if self.add:
            text = f"({text} + {self.add})" if self.add > 0 else f"({text} - {-self.add})"
        return text

    def __str__(self) -> str:
        if self.symbol is None:
            return str(self.add)
        text = self.symbol
        if self.mul != 1:
            text = f"{self.mul}*{text}"
        if self.div != 1:
            text = f"{text}/{self.div}"
        if self.add > 0:
            text = f"{text}+{self.add}"
        elif self.add < 0:
            text = f"{text}-{-self.add}"
        return text


# ---------------------------------------------------------------------------- types

@dataclass(frozen=True)
class TensorType:
    dims: tuple[Dim, ...]
    dtype: str | None = None  # None: the spec's working (floating) dtype
    value_range: tuple[Dim, Dim] | None = None  # integer tensors: [lo, hi)
    # `Tensor[*B, D]`: the first dim is a group of zero or more leading dims. Only the package
    # folds the group; below it (ABI, verifier, generator, lock) dims[0] is the plain symbol B,
    # their product, so that code needs no case of its own.
    batch: bool = False
    # The spec's `no_grad:` list (not the signature's text): a floating input the backward gives
    # no gradient (rope's cos/sin tables). Set by KernelSpec.signature.
    no_grad: bool = False

    @property
    def ndim(self) -> int:
        return len(self.dims)

    @property
    def is_floating(self) -> bool:
        return self.dtype is None or self.dtype in FLOAT_DTYPES

    @property
    def differentiable(self) -> bool:
        """An input the backward computes a gradient for (`grad_<name>` in the ABI)."""
        return self.is_floating and not self.no_grad

    def symbols(self) -> list[str]:
        found = [d.symbol for d in self.dims if d.symbol]
        if self.value_range:
            found += [d.symbol for d in self.value_range if d.symbol]
        return list(dict.fromkeys(found))

    def shape(self, dims: dict[str, int]) -> tuple[int, ...]:
        return tuple(d.resolve(dims) for d in self.dims)

    def dtype_for(self, working_dtype: str) -> str:
        return self.dtype or working_dtype

    @property
    def batch_symbol(self) -> str | None:
        return self.dims[0].symbol if self.batch else None

    def rows(self) -> "TensorType":
        """The type as a kernel sees it: a batch group `*B` is the one axis B."""
        return replace(self, batch=False)

    def __str__(self) -> str:
        dims = [str(d) for d in self.dims]
        if self.batch:
            dims[0] = "*" + dims[0]
        text = "Tensor[" + ", ".join(dims) + "]"
        if self.dtype:
            text += f" {self.dtype}"
        if self.value_range:
            lo, hi = self.value_range
            text += f" in [{lo}, {hi})"
        return text


@dataclass(frozen=True)
class ScalarType:
    kind: str  # float | int | bool

    def __str__(self) -> str:
        return self.kind


@dataclass(frozen=True)
class Param:
    name: str
    type: TensorType | ScalarType
    default: float | int | bool | None = None
    has_default: bool = False
    # `eps: float = 1e-6 in [1e-12, 1e-2]`: the closed range the verifier draws this scalar from
    value_range: tuple[float, float] | None = None

    @property
    def is_tensor(self) -> bool:
        return isinstance(self.type, TensorType)

    def __str__(self) -> str:
        text = f"{self.name}: {self.type}"
        if self.has_default:
            text += f" = {format_scalar(self.default)}"
        if self.value_range is not None:
            text += f" in [{format_scalar(self.value_range[0])}, {format_scalar(self.value_range[1])}]"
        return text


@dataclass(frozen=True)
class Output:
    name: str
    type: TensorType
    named: bool = False  # written with a name in the signature

    def __str__(self) -> str:
        return f"{self.name}: {self.type}" if self.named else str(self.type)


@dataclass(frozen=True)
class Signature:
    name: str
    params: tuple[Param, ...]
    outputs: tuple[Output, ...]
    text: str = field(default="", compare=False)

    @property
    def inputs(self) -> tuple[Param, ...]:
        return tuple(p for p in self.params if p.is_tensor)

    @property
    def scalars(self) -> tuple[Param, ...]:
        return tuple(p for p in self.params if not p.is_tensor)

    def symbols(self) -> list[str]:
        """Every symbolic dim, in order of first appearance."""
        found: list[str] = []
        for p in self.inputs:
            found += p.type.symbols()
        for o in self.outputs:
            found += o.type.symbols()
        return list(dict.fromkeys(found))

    def input_symbols(self) -> set[str]:
        return {s for p in self.inputs for d in p.type.dims if (s := d.symbol)}

    def without_grads(self, names) -> "Signature":
        """The signature with the tensor inputs `names` marked no_grad (the spec's `no_grad:`)."""
        names = set(names)
        params = tuple(replace(p, type=replace(p.type, no_grad=True)) if p.is_tensor and p.name in names else p
                       for p in self.params)
        return replace(self, params=params)

    def rows(self) -> "Signature":
        """The signature as the kernel sees it: every batch group `*N` folded to its one axis N."""
        params = tuple(replace(p, type=p.type.rows()) if p.is_tensor else p for p in self.params)
        outputs = tuple(replace(o, type=o.type.rows()) for o in self.outputs)
        return replace(self, params=params, outputs=outputs)

    def batch_symbols(self) -> list[str]:
        """The symbols written as a leading batch group (`*B`), in order of first appearance."""
        found = [t.batch_symbol for t in [p.type for p in self.inputs] + [o.type for o in self.outputs]]
        return list(dict.fromkeys(s for s in found if s))

    def symbol_divisors(self) -> dict[str, int]:
        """The multiple each symbol must be, so that every `S*mul/div` is whole."""
        need: dict[str, int] = {}
        for t in [p.type for p in self.inputs] + [o.type for o in self.outputs]:
            for d in t.dims:
                if d.symbol and d.div != 1:
                    step = d.div // math.gcd(d.div, d.mul)
                    need[d.symbol] = math.lcm(need.get(d.symbol, 1), step)
        return need

    def __str__(self) -> str:
        params = ", ".join(str(p) for p in self.params)
        if len(self.outputs) == 1 and not self.outputs[0].named:
            outs = str(self.outputs[0])
        else:
            outs = "(" + ", ".join(str(o) for o in self.outputs) + ")"
        return f"{self.name}({params}) -> {outs}"


def format_scalar(value) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    return str(value)


# ---------------------------------------------------------------------------- parser

_TOKEN = re.compile(
    r"\s*(?:(?P<number>[+-]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<arrow>->)"
    r"|(?P<punct>[()\[\],:=*/+-]))"
)


@dataclass
class _Token:
    kind: str  # number | name | arrow | punct | end
    text: str
    offset: int


def _tokenize(text: str) -> list[_Token]:
    tokens, pos = [], 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            bad = pos + (len(text[pos:]) - len(text[pos:].lstrip()))
            raise SignatureSyntaxError(f"unexpected character {text[bad]!r}", bad, text)
        kind = m.lastgroup
        tokens.append(_Token(kind, m.group(kind), m.start(kind)))
        pos = m.end()
    tokens.append(_Token("end", "", len(text)))
    return tokens


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.tokens = _tokenize(text)
        self.i = 0
        # every symbol use in a shape, for the batch-group rules: (symbol, starred, token, is_output)
        self.uses: list[tuple[str, bool, _Token, bool]] = []
        self.in_outputs = False

    # -- helpers
    @property
    def tok(self) -> _Token:
        return self.tokens[self.i]

    def error(self, message: str, token: _Token | None = None):
        token = token or self.tok
        found = "the end of the signature" if token.kind == "end" else repr(token.text)
        raise SignatureSyntaxError(f"{message}, found {found}", token.offset, self.text)

    def take(self, text: str, what: str | None = None) -> _Token:
        if self.tok.text != text or self.tok.kind not in ("punct", "arrow", "name"):
            self.error(f"expected {what or repr(text)}")
        token = self.tok
        self.i += 1
        return token

    def accept(self, text: str) -> bool:
        if self.tok.text == text and self.tok.kind in ("punct", "arrow", "name"):
            self.i += 1
            return True
        return False

    def name(self, what: str) -> _Token:
        if self.tok.kind != "name":
            self.error(f"expected {what}")
        token = self.tok
        self.i += 1
        return token

    def integer(self, what: str) -> int:
        token = self.tok
        if token.kind != "number" or not re.fullmatch(r"[+-]?\d+", token.text):
            self.error(f"expected {what}")
        self.i += 1
        return int(token.text)

    # -- grammar
    def signature(self) -> Signature:
        op = self.name("the op name")
        self.take("(", "'(' after the op name")
        params: list[Param] = []
        if not self.accept(")"):
            while True:
                params.append(self.param())
                if self.accept(")"):
                    break
                self.take(",", "',' or ')' after a parameter")
        self.take("->", "'->' and the output type(s)")
        self.in_outputs = True
        outputs = self.outputs()
        if self.tok.kind != "end":
            self.error("expected the end of the signature")
        self.check_batch_groups()
        return Signature(op.text, tuple(params), tuple(outputs), text=self.text)

    def param(self) -> Param:
        name = self.name("a parameter name")
        self.take(":", f"':' and a type after {name.text!r}")
        if self.tok.text == "Tensor":
            ptype: TensorType | ScalarType = self.tensor_type()
        elif self.tok.text in SCALAR_TYPES:
            ptype = ScalarType(self.tok.text)
            self.i += 1
        else:
            self.error("expected a type: Tensor[...], float, int or bool")
        if self.accept("="):
            if isinstance(ptype, TensorType):
                self.error("tensor parameters cannot have defaults", self.tokens[self.i - 1])
            default = self.default(ptype)
            return Param(name.text, ptype, default, True, self.scalar_range(ptype, default))
        return Param(name.text, ptype, value_range=self.scalar_range(ptype, None))

    def scalar_range(self, ptype: ScalarType, default) -> tuple[float, float] | None:
        """`in [lo, hi]` after a float or int scalar: the values the verifier draws it from."""
        if not (self.tok.kind == "name" and self.tok.text == "in"):
            return None
        start = self.tok
        if ptype.kind == "bool":
            self.error("a bool scalar takes no range", start)
        self.i += 1
        self.take("[", "'[' (a scalar's range is closed: in [lo, hi])")
        lo = self.default(ptype)
        self.take(",", "',' between the range's bounds")
        hi = self.default(ptype)
        self.take("]", "']' (a scalar's range is closed: in [lo, hi])")
        if not lo <= hi:
            self.error(f"the range [{lo}, {hi}] is empty: write the lower bound first", start)
        if default is not None and not lo <= default <= hi:
            self.error(f"the default {default} lies outside its range [{lo}, {hi}]", start)
        return (lo, hi)

    def default(self, ptype: ScalarType):
        token = self.tok
        sign = ""
        if token.kind == "punct" and token.text == "-":
            sign = "-"
            self.i += 1
            token = self.tok
        if ptype.kind == "bool":
            if token.text in ("True", "true"):
                value: float | int | bool = True
            elif token.text in ("False", "false"):
                value = False
            else:
                self.error("expected True or False")
        elif ptype.kind == "float" and token.kind == "name" and token.text in ("inf", "nan"):
            value = float(sign + token.text)
        elif token.kind == "number":
            if ptype.kind == "int":
                if not re.fullmatch(r"[+-]?\d+", token.text):
                    self.error("expected an integer default")
                value = int(sign + token.text)
            else:
                value = float(sign + token.text)
        else:
            self.error(f"expected a {ptype.kind} default")
        self.i += 1
        return value

    def tensor_type(self) -> TensorType:
        self.take("Tensor")
        self.take("[", "'[' after Tensor (write Tensor[] for a 0-d tensor)")
        dims: list[Dim] = []
        batch = self.tok.text == "*" and self.tok.kind == "punct"
        if batch:
            dims.append(self.batch_dim())
            closed = self.accept("]")
            if not closed:
                self.take(",", "',' or ']' after the batch group")
        else:
            closed = self.accept("]")
        if not closed:
            while True:
                dims.append(self.dim())
                if self.accept("]"):
                    break
                self.take(",", "',' or ']' in the shape")
        dtype = None
        if self.tok.kind == "name" and self.tok.text != "in":
            if self.tok.text not in TENSOR_DTYPES:
                self.error(f"expected a dtype ({', '.join(TENSOR_DTYPES)})")
            dtype = self.tok.text
            self.i += 1
        value_range = None
        if self.tok.text == "in" and self.tok.kind == "name":
            in_token = self.tok
            self.i += 1
            if dtype not in INT_DTYPES:
                self.error("a value range ('in [lo, hi)') is only for integer tensors: "
                           "write the dtype first, e.g. Tensor[N] int64 in [0, C)", in_token)
            self.take("[", "'[' to open the value range")
            lo = self.dim(allow_negative=True)
            self.take(",", "',' in the value range")
            hi = self.dim(allow_negative=True)
            self.take(")", "')': value ranges are half-open, [lo, hi)")
            value_range = (lo, hi)
        return TensorType(tuple(dims), dtype, value_range, batch)

    def batch_dim(self) -> Dim:
        """`*NAME`, the first dim only: a group of zero or more leading dims."""
        star = self.take("*")
        if self.tok.kind != "name":
            self.error("a batch group is '*' and a plain symbol, such as *B")
        name = self.tok
        self.i += 1
        if self.tok.text not in (",", "]"):
            self.error("a batch group is '*' and a plain symbol, such as *B (no sizes or expressions)")
        self.uses.append((name.text, True, star, self.in_outputs))
        return Dim(name.text)

    def check_batch_groups(self) -> None:
        """A starred symbol is starred wherever it appears, as a tensor's first dim only, and an
        input carries it wherever an output does."""
        starred = {sym for sym, star, _, _ in self.uses if star}
        for sym, star, token, _ in self.uses:
            if sym in starred and not star:
                raise SignatureSyntaxError(
                    f"{sym!r} is a batch group (*{sym}) elsewhere: write it *{sym}, as the first dim, in every "
                    f"tensor that uses it", token.offset, self.text)
        for sym, star, token, is_output in self.uses:
            if star and is_output and not any(s == sym and not out for s, _, _, out in self.uses):
                raise SignatureSyntaxError(
                    f"output batch group *{sym} is carried by no input: an input must have it as its first dim",
                    token.offset, self.text)

    def dim(self, allow_negative: bool = False) -> Dim:
        """INT | SYM | INT*SYM | SYM*INT, then optional /INT, then optional +INT or -INT."""
        start = self.tok
        if start.kind == "number":
            value = self.integer("a size")
            if value < 0 and not allow_negative:
                self.error("sizes cannot be negative", start)
            if self.accept("*"):
                mul = value
                sym = self.name("a dimension symbol after '*'").text
            else:
                return Dim.literal(value)
        elif start.kind == "name":
            sym = self.name("a dimension").text
            mul = 1
            if self.accept("*"):
                mul = self.integer("an integer after '*'")
        elif start.text == "*" and start.kind == "punct":
            self.error("only a tensor's first dim may be a batch group (*NAME)")
        else:
            self.error("expected a dimension (a symbol such as N, a size such as 64, or 2*H, D/2)")
        div = 1
        if self.accept("/"):
            div = self.integer("an integer after '/'")
        add = 0
        if self.tok.kind == "number" and self.tok.text[0] in "+-":
            # the tokenizer glues the sign to the number: `N-1` arrives as N, -1
            add = self.integer("an integer offset")
        elif self.accept("+"):
            add = self.integer("an integer after '+'")
        elif self.accept("-"):
            add = -self.integer("an integer after '-'")
        if mul <= 0 or div <= 0:
            self.error("multipliers and divisors must be positive", start)
        self.uses.append((sym, False, start, self.in_outputs))
        return Dim(sym, mul, div, add)

    def outputs(self) -> list[Output]:
        if self.accept("("):
            outs = [self.output(0)]
            while self.accept(","):
                outs.append(self.output(len(outs)))
            self.take(")", "')' to close the outputs")
            if len(outs) == 1 and not outs[0].named:
                return [Output("out", outs[0].type)]
            return [o if o.named else Output(f"out{k}", o.type) for k, o in enumerate(outs)]
        out = self.output(0)
        return [out if out.named else Output("out", out.type)]

    def output(self, index: int) -> Output:
        if self.tok.kind == "name" and self.tok.text != "Tensor":
            name = self.name("an output name").text
            self.take(":", f"':' after the output name {name!r}")
            if self.tok.text != "Tensor":
                self.error("outputs are tensors: expected Tensor[...]")
            return Output(name, self.tensor_type(), named=True)
        if self.tok.text != "Tensor":
            self.error("expected an output type Tensor[...]")
        return Output(f"out{index}", self.tensor_type())


def parse_signature(text: str) -> Signature:
    """Parse and check a signature; raises SignatureSyntaxError with the offending offset."""
    sig = _Parser(text).signature()
    _check(sig, text)
    return sig


def _offset_of(text: str, word: str, start: int = 0) -> int:
    m = re.search(rf"\b{re.escape(word)}\b", text[start:])
    return start + m.start() if m else 0


def _check(sig: Signature, text: str) -> None:
    seen: set[str] = set()
    for p in sig.params:
        if p.name in seen:
            raise SignatureSyntaxError(f"parameter {p.name!r} is declared twice", _offset_of(text, p.name, text.index(p.name) + 1), text)
        seen.add(p.name)
    out_names: set[str] = set()
    arrow = text.find("->")
    for o in sig.outputs:
        if o.name in seen or o.name in out_names:
            raise SignatureSyntaxError(f"output name {o.name!r} is already used", _offset_of(text, o.name, arrow), text)
        out_names.add(o.name)
    if not sig.outputs:
        raise SignatureSyntaxError("the op needs at least one output", arrow, text)
    bound = sig.input_symbols()
    for o in sig.outputs:
        for d in o.type.dims:
            if d.symbol and d.symbol not in bound:
                raise SignatureSyntaxError(
                    f"output dimension {d.symbol!r} is not bound by any input: every symbol in an "
                    f"output shape must appear in an input's shape", _offset_of(text, d.symbol, arrow), text)
    symbols = set(sig.symbols())
    for name in seen | out_names:
        if name in symbols:
            raise SignatureSyntaxError(f"{name!r} is both a dimension symbol and an argument name; rename one",
                                       _offset_of(text, name), text)
    for p in sig.params:
        if p.is_tensor and p.type.dtype in INT_DTYPES and p.type.value_range is None:
            raise SignatureSyntaxError(
                f"integer tensor {p.name!r} needs its value range, e.g. Tensor[N] {p.type.dtype} in [0, C)",
                _offset_of(text, p.name), text)


def parse_tensor_type(text: str) -> TensorType:
    """One tensor type on its own (`Tensor[N] float32`), as the signature writes it; a saved
    value's declaration (specgen/saved.py) uses it. Raises SignatureSyntaxError."""
    parser = _Parser(text)
    if parser.tok.text != "Tensor":
        parser.error("expected a tensor type such as Tensor[N] float32")
    ttype = parser.tensor_type()
    if parser.tok.kind != "end":
        parser.error("expected the end of the type")
    return ttype
