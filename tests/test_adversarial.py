"""Every adversarial kernel is rejected for its own reason; every good kernel passes.

Here (nvcc, no GPU): each kernel compiles (or fails to, when that is its bug) and the
static checks give the expected verdict. On the GPU: the full verifier, with --sanitize
for the kernels whose bug only compute-sanitizer can see.
"""
from __future__ import annotations

from collections import Counter

import pytest

from verify_support import adversarial_kernels, good_kernels, record
from specgen.spec import load_spec
from specgen.verify import REASONS, static_checks, verify_kernel

ADVERSARIAL = adversarial_kernels()
GOOD = good_kernels()
ARCH = "sm_90"  # the H200; compile-only runs here need an explicit target


def test_the_suite_covers_the_issue():
    """At least 30 bad kernels over the issue's reasons, each expectation a known reason, several
    kernels for each of the hardened verifier's checks; good kernels for three specs, unusual
    variants (`<spec>__<variant>.cu`) among them."""
    assert len(ADVERSARIAL) >= 30
    assert {c.expect for c in ADVERSARIAL} <= set(REASONS)
    expected = Counter(c.expect for c in ADVERSARIAL)
    # a plain fork to another stream is not-capturable; one honest while captured is a stream-violation
    for reason in ("unwritten-output", "wrong-result", "input-mutated", "nondeterministic", "stream-violation",
                   "post-timing-mismatch", "not-capturable", "out-of-bounds", "forbidden-symbol", "sanitizer"):
        assert reason in expected, reason
    # idle when timed: a GPU clock, a host clock, a fingerprint (the call counter idles in the
    # small phases already: unwritten-output)
    assert expected["post-timing-mismatch"] >= 3
    # streams, events and syncs of its own: refused by their symbols before anything runs
    assert sum(c.expect == "stream-violation" and c.static for c in ADVERSARIAL) >= 4
    # the legacy stream: no stream function to see, the capture fails (a synchronous cudaMemcpy did
    # not break a capture on the H200, and cudaMalloc/cudaFree, which do, are refused by their symbols)
    assert expected["not-capturable"] >= 1
    # memory kept outside the workspace: module-scope scratch (ptxas's gmem) and cudaMalloc'd tables,
    # refused before anything runs
    static_memory = {"static_scratch_across_calls", "cached_table_malloc", "malloc_free_workspace_in_call"}
    assert {c.name for c in ADVERSARIAL if c.expect == "forbidden-symbol"} >= static_memory
    # run-time loading, reading the process's files or environment, importing Python
    assert expected["forbidden-symbol"] >= 6
    # the sizes, values, scalars and tolerance today's verifier never tries
    assert expected["wrong-result"] >= 8
    assert any(c.sanitize and c.expect == "out-of-bounds" for c in ADVERSARIAL)
    assert {c.spec for c in GOOD} >= {"gelu_tanh", "rmsnorm", "softmax"}
    assert {c.spec for c in GOOD if "__" in c.name} >= {"gelu_tanh", "rmsnorm"}


@pytest.mark.nvcc
@pytest.mark.parametrize("case", ADVERSARIAL + GOOD, ids=lambda c: c.name)
def test_static_checks(case, tmp_path):
    verdict, compiled = static_checks(load_spec(case.spec_path), case.path, arch=ARCH, cache_dir=tmp_path)
    if case.decided_statically:
        assert verdict is not None and verdict.reason == case.expect, verdict and verdict.summary()
        assert verdict.detail
    else:
        assert verdict is None, verdict.summary()
        assert compiled.library.exists()


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.parametrize("case", ADVERSARIAL, ids=lambda c: c.name)
def test_adversarial_kernel_is_rejected(case):
    spec = load_spec(case.spec_path)
    verdict = verify_kernel(spec, case.path, sanitize=case.sanitize,
                            idle_timeout=15 if case.expect == "timeout" else None)
    record("adversarial", case.name, {"spec": case.spec, "expect": case.expect, "got": verdict.reason,
                                      "sanitize": case.sanitize, "detail": verdict.detail[:600],
                                      "counterexample": verdict.counterexample.describe()
                                      if verdict.counterexample else None, "timings": verdict.timings})
    assert verdict.reason == case.expect, verdict.summary()
    assert verdict.detail
    if case.direction:
        assert verdict.counterexample is not None and verdict.counterexample.direction == case.direction


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.parametrize("case", GOOD, ids=lambda c: c.name)
def test_good_kernel_passes(case):
    spec = load_spec(case.spec_path)
    verdict = verify_kernel(spec, case.path)
    record("good", case.name, {"got": verdict.reason, "cases": verdict.cases, "timings": verdict.timings,
                               "tolerances": verdict.tolerances, "detail": verdict.detail[:600]})
    assert verdict.passed, verdict.summary()
    directions = {key.split()[0] for key in verdict.tolerances}
    assert directions == ({"forward", "backward"} if spec.backward == "kernel" else {"forward"})
    assert set(spec.dtypes) == {key.split()[1] for key in verdict.tolerances}


@pytest.mark.nvcc
def test_cli_exit_codes_without_a_gpu(tmp_path, monkeypatch, capsys):
    """Rejected by the static checks: exit 1 with the reason, anywhere. Clean but no GPU: exit 3."""
    import torch

    from specgen.cli import main
    from verify_support import ADVERSARIAL as ADV_DIR, GOOD as GOOD_DIR, REPO

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path))
    spec = str(REPO / "specs" / "gelu_tanh.yaml")
    out = tmp_path / "verdict.json"
    assert main(["verify", spec, "--kernel", str(ADV_DIR / "dlopen_library.cu"), "--arch", ARCH,
                 "--json", str(out)]) == 1
    assert "forbidden-symbol" in capsys.readouterr().out
    assert '"reason": "forbidden-symbol"' in out.read_text()
    assert main(["verify", spec, "--kernel", str(GOOD_DIR / "gelu_tanh.cu"), "--arch", ARCH]) == 3
    assert "no CUDA GPU" in capsys.readouterr().err
