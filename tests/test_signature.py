"""The signature language: generated signatures print and parse back; bad ones point at the character."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from specgen.signature import (
    FLOAT_DTYPES, INT_DTYPES, Dim, Output, Param, ScalarType, Signature, SignatureSyntaxError, TensorType,
    parse_signature,
)

SYMBOLS = ["N", "D", "H", "S", "C", "K"]
ARG_NAMES = ["x", "w", "bias", "target", "cos", "eps", "alpha", "flag", "y2", "t_in"]


def dims_strategy(symbols):
    symbol_dim = st.builds(Dim, st.sampled_from(symbols), st.integers(1, 4), st.integers(1, 4), st.integers(-3, 3))
    literal = st.integers(0, 4096).map(Dim.literal)
    return st.one_of(symbol_dim, literal)


@st.composite
def signatures(draw):
    symbols = draw(st.lists(st.sampled_from(SYMBOLS), min_size=1, max_size=3, unique=True))
    names = draw(st.lists(st.sampled_from(ARG_NAMES), min_size=1, max_size=5, unique=True))
    params = []
    # the first param is a tensor that binds every symbol, so every output dim is bound
    params.append(Param(names[0], TensorType(tuple(Dim(s) for s in symbols),
                                             draw(st.sampled_from([None, *FLOAT_DTYPES]))), None))
    for name in names[1:]:
        kind = draw(st.sampled_from(["tensor", "int_tensor", "float", "int", "bool"]))
        shape = tuple(draw(st.lists(dims_strategy(symbols), max_size=3)))
        if kind == "tensor":
            params.append(Param(name, TensorType(shape, draw(st.sampled_from([None, *FLOAT_DTYPES])))))
        elif kind == "int_tensor":
            lo = draw(st.integers(-5, 5))
            hi = draw(st.one_of(st.integers(6, 100).map(Dim.literal), st.sampled_from(symbols).map(Dim)))
            params.append(Param(name, TensorType(shape, draw(st.sampled_from(INT_DTYPES)), (Dim.literal(lo), hi))))
        else:
            default = {"float": st.floats(-1e6, 1e6, allow_nan=False), "int": st.integers(-100, 100),
                       "bool": st.booleans()}[kind]
            if draw(st.booleans()):
                params.append(Param(name, ScalarType(kind), draw(default), True))
            else:
                params.append(Param(name, ScalarType(kind)))
    n_out = draw(st.integers(1, 3))
    named = draw(st.booleans())
    outputs = []
    for k in range(n_out):
        ttype = TensorType(tuple(draw(st.lists(dims_strategy(symbols), max_size=3))),
                           draw(st.sampled_from([None, "float32", "int64"])),
                           None)
        if ttype.dtype == "int64":
            ttype = TensorType(ttype.dims, "float32")
        name = f"o{k}" if named else ("out" if n_out == 1 else f"out{k}")
        outputs.append(Output(name, ttype, named))
    return Signature("op_" + draw(st.sampled_from(["a", "gelu", "norm2"])), tuple(params), tuple(outputs))


@settings(max_examples=300, deadline=None)
@given(signatures())
def test_print_then_parse_gives_the_same_signature(sig):
    text = str(sig)
    parsed = parse_signature(text)
    assert parsed == sig
    assert str(parsed) == text


def test_example_forms():
    sig = parse_signature("rope(x: Tensor[S, H, D], cos: Tensor[S, D/2], sin: Tensor[S, D/2]) -> Tensor[S, H, D]")
    assert sig.symbol_divisors() == {"D": 2}
    assert sig.inputs[1].type.shape({"S": 3, "D": 8, "H": 2}) == (3, 4)
    sw = parse_signature("swiglu(x: Tensor[N, 2*H]) -> Tensor[N, H]")
    assert sw.inputs[0].type.dims[1] == Dim("H", 2, 1, 0)
    assert sw.inputs[0].type.dims[1].invert(10) == 5
    ce = parse_signature("ce(logits: Tensor[N, C], target: Tensor[N] int64 in [0, C)) -> Tensor[] float32")
    assert ce.outputs[0].type.dims == () and ce.outputs[0].type.dtype == "float32"
    assert ce.inputs[1].type.value_range == (Dim.literal(0), Dim("C"))
    two = parse_signature("f(x: Tensor[N, D]) -> (y: Tensor[N, D], s: Tensor[N])")
    assert [o.name for o in two.outputs] == ["y", "s"]
    anon = parse_signature("f(x: Tensor[N, D]) -> (Tensor[N, D], Tensor[N])")
    assert [o.name for o in anon.outputs] == ["out0", "out1"]


@pytest.mark.parametrize("text, offset, words", [
    ("f(x: Tensor[N]) -> Tensor[M]", 26, "not bound by any input"),
    ("f(x: Tensor[N) -> Tensor[N]", 13, "expected ',' or ']'"),
    ("f(x: Tensr[N]) -> Tensor[N]", 5, "expected a type"),
    ("f(x: Tensor[N] float33) -> Tensor[N]", 15, "expected a dtype"),
    ("f(x: Tensor[N] int64) -> Tensor[N]", 2, "needs its value range"),
    ("f(x: Tensor[N] in [0, 4)) -> Tensor[N]", 15, "only for integer tensors"),
    ("f(x: Tensor[N], x: Tensor[N]) -> Tensor[N]", 16, "declared twice"),
    ("f(x: Tensor[N]) Tensor[N]", 16, "expected '->'"),
    ("f(x: Tensor[N]) -> Tensor[N] extra", 29, "expected a dtype"),
    ("f(x: Tensor[N]) -> Tensor[N], 3", 28, "end of the signature"),
    ("f(x: Tensor[N], N: int) -> Tensor[N]", 12, "both a dimension symbol and an argument"),
    ("f(x: Tensor[N], e: float = abc) -> Tensor[N]", 27, "expected a float default"),
    ("f(x: Tensor[N] $) -> Tensor[N]", 15, "unexpected character"),
])
def test_bad_signatures_point_at_the_character(text, offset, words):
    with pytest.raises(SignatureSyntaxError) as info:
        parse_signature(text)
    assert words in info.value.message
    assert info.value.offset == offset, info.value.caret()


@pytest.mark.parametrize("text, expected", [("N", "A.N"), ("2*H", "A.H * 2"), ("D/2", "(A.D) / 2"),
                                            ("N+1", "(A.N + 1)"), ("N-3", "(A.N - 3)"), ("64", "64")])
def test_dims_render_as_c_expressions(text, expected):
    dim = parse_signature(f"f(x: Tensor[{text}, N, H, D]) -> Tensor[N]").inputs[0].type.dims[0]
    assert dim.c_expr("A.") == expected
    values = {"N": 7, "H": 5, "D": 12}
    assert eval(expected.replace("A.", "").replace("/", "//"), {}, values) == dim.resolve(values)
