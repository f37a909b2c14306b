"""The candidate built with plain `char` unsigned, as on aarch64 hosts such as GH200 (verifier
version 16, specgen/verify/char_abi.py). Held-out attacks-v11's layernorm_gelu_a kept a host plan
`char rows_log2` with -1 for "a block per row": signed on x86-64, 255 on aarch64, where every row
took the path that holds 1024 elements. Every other case runs the x86-64 build.

The kernels below are host-only (the CPU runner's tensors are host memory, so an entry point's
host code is all that runs): a `scale` whose plan holds -1 in a plain `char` for rows wider than
the 64 elements its narrow path holds, and the same with `signed char`. Both builds of each are
made by nvcc as the verifier makes them and called on the CPU."""
from __future__ import annotations

import pytest

from host_only_kernels import compiled_library, scale_spec
from specgen.verify.char_abi import (HINT, PREFIX, UNSIGNED_CHAR_FLAGS, build_unsigned_char, check_unsigned_char,
                                     unsigned_char_cases, unsigned_char_runner)
from specgen.verify.engine import Options, Session, run_verification
from specgen.verify.isolation import LocalRunner
from specgen.verify.verdict import Failure

SMALL = Options(examples=0, budget=1 << 13, seed=1, endurance=0, full_size=False)

PLAN = """\
#include <cuda_runtime.h>
#include "scale_abi.h"
struct Plan { int threads; CHAR cols_log2; };  // log2(columns a row's narrow path holds); -1: the whole row
static Plan plan_for(long D) { Plan p; p.threads = 256; p.cols_log2 = D <= 64 ? 6 : -1; return p; }
extern "C" cudaError_t scale_forward(const scale_args* a, cudaStream_t stream) {
  const Plan p = plan_for(a->D);
  const long held = p.cols_log2 >= 0 ? 64 : a->D;  // the narrow path holds 64 columns
  const long cols = a->D < held ? a->D : held;
  const float* x = (const float*)a->x.data;
  float* out = (float*)a->out.data;
  for (long r = 0; r < a->N; ++r)
    for (long c = 0; c < a->D; ++c) out[r * a->D + c] = c < cols ? (float)(x[r * a->D + c] * a->alpha) : 0.0f;
  return cudaSuccess;
}
"""
PLAIN_CHAR = PLAN.replace("CHAR", "char")
SIGNED_CHAR = PLAN.replace("CHAR", "signed char")
# the same plan written with braces: a narrowing of -1 to unsigned char does not compile
BRACED = PLAIN_CHAR.replace("Plan p; p.threads = 256; p.cols_log2 = D <= 64 ? 6 : -1; return p;",
                            "if (D <= 64) return Plan{256, 6}; return Plan{256, -1};")


@pytest.fixture(scope="module")
def scale(tmp_path_factory):
    return scale_spec(tmp_path_factory)


@pytest.fixture(scope="module")
def builds(scale, tmp_path_factory):
    """{source name: (the normal build, the unsigned-char build)}, compiled once for the module."""
    cache = tmp_path_factory.mktemp("kernels")
    return {name: (compiled_library(scale, source, cache), build_unsigned_char(scale, source, arch="sm_90",
                                                                               cache_dir=cache).library)
            for name, source in (("plain", PLAIN_CHAR), ("signed", SIGNED_CHAR))}


def session_with(spec, normal, unsigned) -> Session:
    session = Session(spec, LocalRunner(spec, normal, "cpu"), SMALL, lambda text: None, "cpu")
    session.unsigned_char_runner = lambda: LocalRunner(spec, unsigned, "cpu")
    return session


def test_the_cases_are_the_smoke_case_and_rows_wider_than_1024_where_the_range_allows(scale):
    from conftest import SPECS
    from specgen.spec import load_spec

    cases = unsigned_char_cases(scale, 1 << 13, 0)
    assert [c.dim_map["D"] for c in cases] == [37, 256]  # the range stops at 256: its top
    layernorm = load_spec(SPECS / "layernorm_gelu.yaml")
    wide = unsigned_char_cases(layernorm, 1 << 20, 0)
    assert [c.dim_map["D"] for c in wide][1:] == [1280, 4096]
    assert [c.dtype for c in wide] == layernorm.dtypes[:3]  # dtypes in turn
    assert all(c.dim_map["N"] * c.dim_map["D"] <= 1 << 20 for c in wide)


@pytest.mark.nvcc
def test_the_second_build_is_cached_and_differs_from_the_first(scale, builds, tmp_path):
    normal, unsigned = builds["plain"]
    assert unsigned != normal and unsigned.exists()
    again = build_unsigned_char(scale, PLAIN_CHAR, arch="sm_90", cache_dir=unsigned.parent)
    assert again.cached and again.library == unsigned
    flags = again.command
    assert any(flags[i:i + 2] == list(UNSIGNED_CHAR_FLAGS) for i in range(len(flags)))


@pytest.mark.nvcc
def test_a_char_plan_holding_minus_one_passes_the_normal_build_and_fails_the_unsigned_one(scale, builds):
    normal, unsigned = builds["plain"]
    wide = unsigned_char_cases(scale, SMALL.budget, 5)[-1]
    plain = Session(scale, LocalRunner(scale, normal, "cpu"), SMALL, lambda text: None, "cpu")
    plain.run_case(wide, "forward")  # x86-64: char is signed, -1 means the whole row
    with pytest.raises(Failure) as caught:
        check_unsigned_char(session_with(scale, normal, unsigned), "forward")
    failure = caught.value
    assert failure.reason in ("wrong-result", "unwritten-output"), failure.detail
    assert failure.detail.startswith(PREFIX) and HINT in failure.detail
    assert failure.counterexample.case["dims"]["D"] == 256  # the smoke case's 37 columns fit the narrow path


@pytest.mark.nvcc
def test_a_signed_char_plan_passes_both_builds(scale, builds):
    session = session_with(scale, *builds["signed"])
    check_unsigned_char(session, "forward")
    assert session.cases == 2


@pytest.mark.nvcc
def test_a_plan_that_does_not_compile_with_unsigned_char_is_a_compile_error(scale, tmp_path):
    compiled_library(scale, BRACED, tmp_path)  # x86-64: fine
    with pytest.raises(Failure) as caught:
        build_unsigned_char(scale, BRACED, arch="sm_90", cache_dir=tmp_path)
    assert caught.value.reason == "compile-error" and caught.value.detail.startswith(PREFIX)
    assert "signed char" in caught.value.detail


@pytest.mark.nvcc
def test_the_engine_runs_the_unsigned_build(scale, builds):
    normal, unsigned = builds["plain"]
    verdict = run_verification(scale, normal, SMALL, device="cpu")
    assert verdict.passed, verdict.summary()  # without the second build: nothing sees it
    options = Options(**{**SMALL.__dict__, "unsigned_char_library": str(unsigned)})
    verdict = run_verification(scale, normal, options, device="cpu")
    assert not verdict.passed and verdict.detail.startswith(PREFIX), verdict.summary()
    honest = Options(**{**SMALL.__dict__, "unsigned_char_library": str(builds["signed"][1])})
    verdict = run_verification(scale, builds["signed"][0], honest, device="cpu")
    assert verdict.passed, verdict.summary()


def test_no_second_build_no_check(scale):
    assert unsigned_char_runner(scale, SMALL, "cpu", False, None) is None
    asked = []
    options = Options(unsigned_char_library="/x/scale-unsigned-char.so")
    factory = unsigned_char_runner(scale, options, "cuda", True, lambda build: asked.append(build) or "runner")
    assert factory() == "runner" and asked == ["/x/scale-unsigned-char.so"]
    session = Session(scale, LocalRunner(scale, object(), "cpu"), SMALL, lambda text: None, "cpu")
    check_unsigned_char(session, "forward")  # a stand-in: no build, nothing run
    assert session.cases == 0


@pytest.mark.gpu
@pytest.mark.nvcc
def test_attacks_v11_layernorm_gelu_a_is_rejected_built_with_unsigned_char(tmp_path):
    """(attacks-v11 is spoiled: read after its first contact, a regression set.) The normal build
    passes the same cases; the unsigned-char build, in a process of its own, does not."""
    from conftest import REPO
    from specgen.spec import load_spec
    from specgen.verify import static_checks
    from specgen.verify.isolation import started_runner

    spec = load_spec(REPO / "heldout" / "attacks-v11" / "specs" / "layernorm_gelu.yaml")
    source = REPO / "heldout" / "attacks-v11" / "layernorm_gelu_a.cu"
    verdict, compiled = static_checks(spec, source, cache_dir=tmp_path)
    assert verdict is None, verdict.summary()
    unsigned = build_unsigned_char(spec, source, arch=compiled.arch, cache_dir=tmp_path).library

    def runner_of(library):
        runner = started_runner(spec)
        runner.wait_ready()
        assert not runner.load(library).fatal
        return runner

    options = Options(examples=0, seed=2, endurance=0, full_size=False)
    normal = Session(spec, runner_of(compiled.library), options, lambda text: None, "cuda")
    try:
        normal.unsigned_char_runner = lambda: runner_of(compiled.library)  # the x86-64 build on the same cases
        check_unsigned_char(normal, "forward")
        normal.unsigned_char_runner = lambda: runner_of(unsigned)
        with pytest.raises(Failure) as caught:
            check_unsigned_char(normal, "forward")
        failure = caught.value
        # (its rows are planned with a char: unsigned, some are skipped; the H100 of session 45 said
        # unwritten-output, 9472 of 47360 elements)
        assert failure.reason in ("wrong-result", "unwritten-output", "cuda-error", "crash") \
            and failure.detail.startswith(PREFIX), \
            (failure.reason, failure.detail[:600])
    finally:
        normal.runner.close()


def test_the_tuner_compiles_the_unsigned_builds_with_the_variants(monkeypatch, tmp_path):
    """compile_many(unsigned_char=True) (the tuner's prepare) leaves each source's unsigned-char build
    in the cache, so the verification's own build_unsigned_char is a cache hit."""
    from conftest import SPECS
    from specgen.agents.builtin.generator import build_source, compile_many
    from specgen.spec import load_spec

    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path))
    spec = load_spec(SPECS / "gelu_tanh.yaml")
    source = build_source(spec)
    (compiled,) = compile_many([(spec, source)], unsigned_char=True)
    assert not isinstance(compiled, Exception), compiled
    again = build_unsigned_char(spec, source, arch=compiled.arch)
    assert again.cached and again.library.is_file()
    other = source.replace("// ", "//  ", 1)  # another source: nothing cached for it
    assert not build_unsigned_char(spec, other, arch=compiled.arch).cached


def test_verify_kernel_starts_the_unsigned_build_beside_the_normal_one(monkeypatch):
    """Where a GPU will run it, verify_kernel's unsigned-char build is under way while the normal
    build compiles (nvcc is one process a build): the normal build here waits until it has started.
    Without a GPU (start_now False) nothing starts until asked."""
    import threading

    from specgen.verify import char_abi, unsigned_char_build_beside

    began, calls = threading.Event(), []

    def fake_build(spec, kernel, *, arch=None, cache_dir=None):
        calls.append(arch)
        began.set()
        return f"built for {arch}"

    monkeypatch.setattr(char_abi, "build_unsigned_char", fake_build)
    with unsigned_char_build_beside(object(), "k.cu", "sm_90", None, start_now=True) as build:
        assert began.wait(10)  # started before anything asked for it
        assert build("sm_90") == "built for sm_90" and calls == ["sm_90"]
        assert build("sm_100") == "built for sm_100"  # another architecture: built then
    assert calls == ["sm_90", "sm_100"]

    calls.clear()
    with unsigned_char_build_beside(object(), "k.cu", "sm_90", None, start_now=False) as build:
        assert calls == []
        assert build("sm_90") == "built for sm_90" and calls == ["sm_90"]
