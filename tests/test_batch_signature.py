"""Leading batch dims (issue 13) in the signature language: `x: Tensor[*B, D]` parses, prints
back and is checked; below the package (ABI header, builtin generator) it is the plain symbol B."""
from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st
from package_support import unbatched_spec
from test_signature import signatures

from specgen import abi
from specgen.agents.builtin.generator import build_source
from specgen.signature import Dim, SignatureSyntaxError, TensorType, parse_signature
from specgen.spec import load_spec

BATCH = Path(__file__).resolve().parent / "batch_specs"
SPECS = Path(__file__).resolve().parent.parent / "specs"
BATCHED = "rmsnorm_batched(x: Tensor[*B, D], weight: Tensor[D], eps: float = 1e-06) -> Tensor[*B, D]"


# ---------------------------------------------------------------- the signature language

def test_a_batch_group_is_the_plain_symbol_with_a_flag_and_prints_back():
    sig = parse_signature(BATCHED)
    x = sig.inputs[0].type
    assert x.batch and x.batch_symbol == "B" and x.dims[0].is_plain_symbol and x.dims[0].symbol == "B"
    assert x.rows() == parse_signature(BATCHED.replace("*B", "B")).inputs[0].type
    assert not sig.inputs[1].type.batch and sig.batch_symbols() == ["B"]
    assert str(sig) == BATCHED and parse_signature(str(sig)) == sig
    assert sig != parse_signature(BATCHED.replace("*B", "B"))
    alone = parse_signature("f(x: Tensor[*B]) -> Tensor[*B] float32")
    assert str(alone) == "f(x: Tensor[*B]) -> Tensor[*B] float32" and alone.outputs[0].type.batch


def _starred(t: TensorType) -> TensorType:
    return replace(t, dims=(Dim("B"),) + t.dims, batch=True)


@st.composite
def batched_signatures(draw):
    """The signature language's generated signatures with a batch group *B on the first input
    and on any other tensors."""
    sig = draw(signatures())
    params = [replace(p, type=_starred(p.type)) if p.is_tensor and (k == 0 or draw(st.booleans())) else p
              for k, p in enumerate(sig.params)]
    outputs = [replace(o, type=_starred(o.type)) if draw(st.booleans()) else o for o in sig.outputs]
    return replace(sig, params=tuple(params), outputs=tuple(outputs))


@settings(max_examples=200, deadline=None)
@given(batched_signatures())
def test_batched_signatures_print_then_parse_back(sig):
    text = str(sig)
    assert "*B" in text
    parsed = parse_signature(text)
    assert parsed == sig and str(parsed) == text
    plain = parse_signature(text.replace("*B", "B"))  # the same dims, the plain symbol
    assert [p.type.rows() for p in parsed.inputs] == [p.type for p in plain.inputs]
    assert [o.type.rows() for o in parsed.outputs] == [o.type for o in plain.outputs]


# `at`: a regular expression that matches where the error points
@pytest.mark.parametrize("text, at, words", [
    ("f(x: Tensor[N, *B]) -> Tensor[N]", r"\*B", "only a tensor's first dim may be a batch group"),
    ("f(x: Tensor[*4, D]) -> Tensor[D]", "4", "a batch group is '*' and a plain symbol"),
    ("f(x: Tensor[*2*B, D]) -> Tensor[D]", "2", "a batch group is '*' and a plain symbol"),
    ("f(x: Tensor[*B+1, D]) -> Tensor[D]", r"\+1", "no sizes or expressions"),
    ("f(x: Tensor[*B, D], y: Tensor[B]) -> Tensor[D]", r"B\]", "'B' is a batch group (*B) elsewhere"),
    ("f(x: Tensor[*B, D]) -> Tensor[B, D]", r"(?<=\[)B, D\]$", "'B' is a batch group (*B) elsewhere"),
    ("f(x: Tensor[D, B]) -> Tensor[*B, D]", r"B\]", "'B' is a batch group (*B) elsewhere"),
    ("f(x: Tensor[D]) -> Tensor[*B, D]", r"\*B", "output batch group *B is carried by no input"),
])
def test_each_batch_group_rule_is_a_syntax_error_at_its_character(text, at, words):
    with pytest.raises(SignatureSyntaxError) as info:
        parse_signature(text)
    assert words in info.value.message
    assert info.value.offset == re.search(at, text).start()


def test_a_spec_without_a_batch_group_hashes_and_prints_as_before():
    spec = load_spec(SPECS / "layernorm_gelu.yaml")
    assert not spec.signature.batch_symbols()
    assert str(spec.signature) == spec.signature.text.replace("1e-5", "1e-05")
    # the lock records this hash for the committed kernel: a change here would orphan it
    lock = (SPECS / "specgen.lock").read_text()
    assert spec.hash() in lock


def test_writing_a_batch_group_for_the_row_axis_keeps_the_kernel_contract_and_its_hash(tmp_path):
    """`*N` is the axis N to the kernel (same ABI struct, same verification): the spec hash covers
    the signature as the kernel sees it, so a verified lock stays fresh. The package's signature
    keeps the group (its composite op folds the leading dims)."""
    batched = load_spec(SPECS / "gelu_tanh.yaml")
    assert batched.signature.batch_symbols() == ["N"]
    plain = unbatched_spec(SPECS / "gelu_tanh.yaml")
    assert not plain.signature.batch_symbols()
    plain_text = Path(plain.path).read_text()
    assert batched.hash() == plain.hash()
    assert str(batched.signature.rows()) == str(plain.signature) != str(batched.signature)
    # any other change still moves it: a group on a different axis symbol is another ABI
    other = plain_text.replace("Tensor[N, D]", "Tensor[*M, D]").replace("{N:", "{M:").replace("N: ", "M: ")
    (tmp_path / "gelu_tanh.yaml").write_text(other)
    assert load_spec(tmp_path / "gelu_tanh.yaml").hash() != plain.hash()


# ---------------------------------------------------------------- below the package: the plain symbol B

@pytest.fixture(scope="module")
def batched():
    return load_spec(BATCH / "rmsnorm_batched.yaml")


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """The same spec written with B for *B (and another name)."""
    text = (BATCH / "rmsnorm_batched.yaml").read_text().replace("*B", "B").replace("rmsnorm_batched", "rmsnorm_plain")
    path = tmp_path_factory.mktemp("plain") / "rmsnorm_plain.yaml"
    path.write_text(text)
    return load_spec(path)


def _body(source: str, name: str) -> str:
    """A generated source without its leading comment block (the spec's path and signature)."""
    lines = source.replace(name, "OP").replace(name.upper(), "OP").splitlines()
    return "\n".join(lines[next(k for k, line in enumerate(lines) if not line.startswith("//") and line.strip()):])


def test_the_builtin_generator_writes_the_kernel_of_the_plain_symbol(batched, plain):
    assert _body(build_source(batched), batched.name) == _body(build_source(plain), plain.name)


def test_the_abi_header_is_the_one_of_the_plain_symbol(batched, plain):
    header = abi.header_text(batched)
    assert "Tensor[*B" not in header.split("*/", 1)[1]  # the fields: the kernel sees [B, D]
    assert "The package folds the leading dims *B into one axis B before the kernel." in header
    strip = [line for line in header.replace(batched.name, "OP").replace("RMSNORM_BATCHED", "OP").splitlines()
             if "Tensor[*B" not in line and "folds the leading dims" not in line]
    other = [line for line in abi.header_text(plain).replace(plain.name, "OP").replace("RMSNORM_PLAIN", "OP")
             .splitlines() if "OP(x: Tensor[B" not in line]
    assert strip == other
    assert abi.fields(batched, "forward") == abi.fields(plain, "forward")


@pytest.mark.parametrize("name", ["rmsnorm_batched", "add_batched"])
def test_specgen_check_runs_the_batched_specs_references_on_the_plain_symbol(name):
    from specgen.checking import check_spec

    result = check_spec(BATCH / f"{name}.yaml", samples=1)
    assert result.ok, result.error
    assert result.runs and all(" B=" in run for run in result.runs)
