"""Issue 14: `specgen check` on generated spec files and signature text ends in a result or a
SpecError with a location, never another exception, a traceback or a hang. Example counts
are modest (the whole file runs in well under a minute on two cores)."""
from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specgen.checking import check_spec
from specgen.cli import main
from specgen.errors import SpecError
from specgen.spec import SPEC_FIELDS

# CI runs 150 examples per test; SPECGEN_FUZZ_EXAMPLES=2000 runs thousands (benchmarks/results/*fuzz*).
FUZZ_EXAMPLES = int(os.environ.get("SPECGEN_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                        HealthCheck.function_scoped_fixture])

GOOD_NAMES = ["x", "w", "b", "t", "scale", "mask"]
BAD_NAMES = ["Tensor", "float", "class", "torch", "new", "None", "in", "grad_x", "_p", "a__b", "é", "n" * 70,
             "threadIdx", "errno"]
NAMES = st.one_of(st.sampled_from(GOOD_NAMES), st.sampled_from(GOOD_NAMES), st.sampled_from(BAD_NAMES))
SYMBOLS = st.sampled_from(["N", "D", "H", "C", "S"])
DIMS = st.one_of(SYMBOLS, SYMBOLS, SYMBOLS, st.integers(-3, 2**41).map(str),
                 st.builds("{}*{}".format, st.integers(0, 9), SYMBOLS),
                 st.builds("{}/{}".format, SYMBOLS, st.integers(0, 9)),
                 st.builds("{}-{}".format, SYMBOLS, st.integers(0, 3)))
TENSOR = st.builds(lambda dims, tail: "Tensor[" + ", ".join(dims) + "]" + tail,
                   st.one_of(st.lists(DIMS, max_size=3), st.lists(DIMS, max_size=3), st.lists(DIMS, max_size=10)),
                   st.sampled_from(["", "", "", " float32", " int64 in [0, C)", " int32", " bool", " int64 in [N, 0)"]))
SCALAR = st.sampled_from(["float = 1e-5", "int = 3", "bool = True", "float = inf", "float = -inf", "float = nan",
                          "float", "int = 1.5"])
PARAMS = st.builds(lambda first, rest: [first] + [p for p in rest if p[0] != first[0]],
                   st.tuples(NAMES, TENSOR),
                   st.lists(st.tuples(NAMES, st.one_of(TENSOR, SCALAR)), max_size=3, unique_by=lambda p: p[0]))


def _signature(op: str, params: list, out: str | None, extra_out: list) -> str:
    first = next((t for _, t in params if t.startswith("Tensor")), "Tensor[N]")
    outs = [out or first] + extra_out
    text = ", ".join(f"{n}: {t}" for n, t in params)
    return f"{op}({text}) -> " + (outs[0] if len(outs) == 1 else "(" + ", ".join(outs) + ")")


PLAIN = st.builds(lambda dims, scalars, names: _signature(
    "op", [("x", "Tensor[" + ", ".join(dims) + "]")] + [(n, t) for n, t in zip(names, scalars)], None, []),
    st.lists(SYMBOLS, min_size=1, max_size=3), st.lists(SCALAR, max_size=2),
    st.lists(st.sampled_from(["alpha", "eps", "k", "lambda", "None"]), max_size=2, unique=True))
SIGNATURE = st.one_of(
    PLAIN, PLAIN,
    st.builds(_signature, st.sampled_from(["op", "op", "class", "o" * 80]), PARAMS, st.one_of(st.none(), TENSOR),
              st.lists(st.builds("{}: {}".format, NAMES, TENSOR), max_size=2)),
    st.builds(_signature, st.just("op"), PARAMS, st.none(), st.just([])),
    st.text(alphabet="opxND()[],:=*/+-> 0123456789.eTensorfloat\"'#\n\\", max_size=80))
REFERENCES = st.sampled_from([
    "def reference(*args, **kwargs):\n    return args[0] * 2\n",
    "def reference(*args, **kwargs):\n    return args[0] * 2\n",
    "def reference(*args, **kwargs):\n    return args[0]\n",
    "import torch\ndef reference(*args, **kwargs):\n    return torch.zeros(3)\n",
    "def reference(*args, **kwargs):\n    raise ValueError('no')\n",
    "import sys\ndef reference(*args, **kwargs):\n    sys.exit(0)\n",
    "import os\ndef reference(*args, **kwargs):\n    os._exit(1)\n",
    "def reference(*args, **kwargs):\n    args[0].add_(1)\n    return args[0].clone()\n",
    "def reference(*args, **kwargs):\n    while True:\n        pass\n",
    "def reference(\n",
    "reference = 3\n",
])


def run_check(text: str) -> None:
    """check_spec on the text: a result, or a SpecError with a location; nothing else."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "fuzz.yaml"
        path.write_text(text, encoding="utf-8", errors="surrogateescape")
        result = check_spec(path, samples=1)
        if result.error is not None:
            assert isinstance(result.error, SpecError)
            assert result.error.location is not None and str(result.error)


def spec_text(signature: str, reference: str, dims: dict, extra: dict) -> str:
    name = signature.split("(")[0].strip() or "op"
    data = {"name": name, "description": "fuzzed", "signature": signature, "dtypes": ["float32"],
            "dims": dims, "reference": reference, **extra}
    return yaml.safe_dump(data, allow_unicode=True, sort_keys=False)


BOUNDS = st.one_of(st.tuples(st.integers(0, 4), st.integers(4, 64)), st.tuples(st.integers(0, 4), st.integers(4, 64)),
                   st.tuples(st.integers(-2, 64), st.integers(-2, 2**40)))


@FUZZ
@given(signature=SIGNATURE, reference=REFERENCES, bounds=st.lists(BOUNDS, min_size=5, max_size=5))
def test_fuzzed_signatures_never_escape_as_exceptions(monkeypatch, signature, reference, bounds):
    monkeypatch.setattr("specgen.checking.REFERENCE_TIMEOUT_S", 2.0)
    symbols = sorted(set(re.findall(r"\b[A-Z]\b", signature)))
    dims = {s: list(b) for s, b in zip(symbols, bounds)}
    run_check(spec_text(signature, reference, dims, {}))


YAML_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(), st.text(max_size=12)),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.one_of(st.text(max_size=6),
                                                                               st.integers()), children,
                                                                     max_size=4),
    max_leaves=10)


@FUZZ
@given(changes=st.dictionaries(st.sampled_from(SPEC_FIELDS + ["extra", "benchmarks"]), YAML_VALUES, max_size=3))
def test_fuzzed_spec_values_never_escape_as_exceptions(monkeypatch, changes):
    monkeypatch.setattr("specgen.checking.REFERENCE_TIMEOUT_S", 2.0)
    base = {"name": "op", "description": "d", "signature": "op(x: Tensor[N, D]) -> Tensor[N, D]",
            "dtypes": ["float32"], "dims": {"N": [1, 8], "D": [1, 8]},
            "reference": "def reference(x):\n    return x * 2\n"}
    run_check(yaml.safe_dump({**base, **changes}, sort_keys=False))


GOOD = """\
name: op
description: Multiply by two.
signature: "op(x: Tensor[N, D], alpha: float = 2.0) -> Tensor[N, D]"
dtypes: [float32, bfloat16]
dims: {N: [1, 64], D: [1, 64]}
reference: |
  def reference(x, alpha=2.0):
      return x * alpha
benchmark: [{N: 8, D: 8}]
tolerance: {float32: {atol: 1e-5}}
"""


@FUZZ
@given(start=st.integers(0, len(GOOD)), length=st.integers(0, 12),
       insert=st.text(alphabet="&*!|>-:{}[],'\"#%@` \n\t\\\x00\ufeff9xN", max_size=12))
def test_fuzzed_yaml_text_never_escapes_as_exceptions(monkeypatch, start, length, insert):
    monkeypatch.setattr("specgen.checking.REFERENCE_TIMEOUT_S", 2.0)
    run_check(GOOD[:start] + insert + GOOD[start + length:])


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(signature=SIGNATURE)
def test_the_cli_prints_no_traceback(tmp_path_factory, capsys, signature):
    folder = tmp_path_factory.mktemp("cli")
    (folder / "s.yaml").write_text(spec_text(signature, "def reference(x):\n    return x * 2\n",
                                             {"N": [1, 4], "D": [1, 4]}, {}))
    code = main(["check", str(folder)])
    captured = capsys.readouterr()
    assert code in (0, 2)
    assert "Traceback" not in captured.out + captured.err and "internal error" not in captured.err
    assert json.dumps(signature)  # the text round-trips (surrogates are written escaped)
