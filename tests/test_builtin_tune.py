"""Autotuning in the user's path (agents/builtin/tune.py, `specgen generate` / `specgen build`)
on a CPU: a fake backend (tests/tune_fakes.py) stands for the verifier and the timer."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from specgen import cli, lock
from specgen.agents.builtin import tune
from specgen.spec import load_spec

from specgen.agents.builtin.schedule import VARIANTS
from tune_fakes import FakeBackend, NoGpuCalls, variant_of

SPECS = Path(__file__).resolve().parent.parent / "specs"


@pytest.fixture
def op_path(tmp_path):
    shutil.copy(SPECS / "swiglu.yaml", tmp_path / "swiglu.yaml")
    return tmp_path / "swiglu.yaml"


def _rows(spec) -> int:
    return len(spec.benchmark) * len(spec.dtypes) * (2 if spec.backward == "kernel" else 1)


# ---------------------------------------------------------------------------- the tuner alone

def test_tuner_times_every_variant_and_verifies_the_fastest_first_until_one_passes(op_path):
    spec = load_spec(op_path)
    # (fewblock and fewtwo give swiglu, a row-free program, the default's text: not tried again)
    times = {"default": 100.0, "regs16": 90.0, "wave": 50.0, "cl256": 95.0}
    backend = FakeBackend(kernel_us=lambda v, row: times[v], failing={"wave"})
    result = tune.tune(spec, backend, budget_s=1000, clock=backend.clock)
    assert result.variant == "regs16" and result.decision == tune.KERNEL  # wave is faster but wrong
    assert "// Schedule variant: regs16." in result.source
    variants = result.record["variants"]
    assert set(variants) == set(times)
    assert variants["wave"]["verified"] is False and "wrong_output" in variants["wave"]["reason"]
    assert "rows" not in variants["wave"]  # a wrong kernel's times are dropped
    assert variants["regs16"]["verified"] and variants["regs16"]["geomean_us"] == pytest.approx(90.0)
    for name in ("default", "cl256"):  # slower than a verified variant: timed, never needed verifying
        assert variants[name]["verified"] is False and "not needed" in variants[name]["verification"]
        assert len(variants[name]["rows"]) == _rows(spec) and "reason" not in variants[name]
    verified = [name for kind, name in backend.calls if kind == "verify"]
    timed = [name for kind, name in backend.calls if kind == "time"]
    assert timed[0] == "default" and set(timed) == set(times)
    assert verified == ["wave", "regs16"]  # fastest first; the first that passes ends it
    assert [kind for kind, _ in backend.calls].count("eager") == 1  # eager once, not per variant
    rows = result.record["rows"]
    assert len(rows) == _rows(spec) and all(r["speedup_vs_eager"] == pytest.approx(200 / 90, rel=1e-3) for r in rows)
    assert result.record["key"] == tune.tuning_key(spec, "sm_90") and result.record["complete"]
    assert result.benchmark["rows"] and result.verification["passed"]
    summary = tune.summary_lines(result.record)
    assert "4 variant(s): 1 verified, 2 timed only (slower), 1 not kept" in summary[0]
    assert "  default: 100.0 us geomean (not verified)" in summary and "  regs16: 90.0 us geomean" in summary


def test_within_the_noise_of_the_fastest_verified_the_earlier_tried_is_verified_and_kept(op_path):
    spec = load_spec(op_path)
    times = {"default": 100.0, "regs16": 99.0, "wave": 60.0, "cl256": 101.0}
    backend = FakeBackend(kernel_us=lambda v, row: times[v], failing={"wave"})
    result = tune.tune(spec, backend, budget_s=1000, clock=backend.clock)
    assert result.variant == "default"  # regs16 is faster by less than the noise
    assert [name for kind, name in backend.calls if kind == "verify"] == ["wave", "regs16", "default"]


def test_a_variant_faster_only_by_noise_does_not_displace_the_default(op_path):
    """Within TIE_RATIO the variant tried first (the default) keeps its place: held-out hardswish,
    timed at decode sizes only, got `flat1w64` by 0.05% of noise (session 17)."""
    spec = load_spec(op_path)
    assert 0.95 < tune.TIE_RATIO < 1
    near = {"default": 100.0, "regs16": 99.0, "wave": 99.5, "cl256": 101.0}
    backend = FakeBackend(kernel_us=lambda v, row: near[v])
    assert tune.tune(spec, backend, budget_s=1000, clock=backend.clock).variant == "default"
    # beyond the noise the faster one wins, as before
    far = {**near, "regs16": 100.0 * tune.TIE_RATIO - 0.5}
    backend = FakeBackend(kernel_us=lambda v, row: far[v])
    assert tune.tune(spec, backend, budget_s=1000, clock=backend.clock).variant == "regs16"


def test_a_timing_spec_times_the_variants_at_its_shapes_while_the_spec_is_verified(op_path, tmp_path):
    """A harness that verifies without a shape too large for the verifier's checked timing can
    still have the tuner time every variant there: there a launch difference shows."""
    import yaml

    spec = load_spec(op_path)
    data = yaml.safe_load(op_path.read_text())
    small = [dict(s) for s in data["benchmark"] if s["N"] <= 64] or [{"N": 8, "H": 4096}]
    data["benchmark"] = small
    (tmp_path / "small").mkdir()
    (tmp_path / "small" / "swiglu.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    verified = load_spec(tmp_path / "small" / "swiglu.yaml")
    large = {tuple(sorted(d.items())) for d in spec.benchmark} - {tuple(sorted(d.items())) for d in small}
    assert large  # the full spec has shapes the small one lacks
    # regs16 is faster at the large shapes only; at the small ones a tie
    times = lambda v, row: 80.0 if v == "regs16" and tuple(sorted(row["dims"].items())) in large else 100.0  # noqa: E731
    backend = FakeBackend(kernel_us=times)
    result = tune.tune(verified, backend, budget_s=1000, clock=backend.clock, timing_spec=spec)
    assert result.variant == "regs16"
    assert len(result.record["rows"]) == _rows(spec)  # every shape of the timing spec, eager beside
    backend = FakeBackend(kernel_us=times)
    assert tune.tune(verified, backend, budget_s=1000, clock=backend.clock).variant == "default"


def test_the_budget_stops_timing_and_the_first_verified_variant_is_found_whatever_it(op_path):
    spec = load_spec(op_path)
    backend = FakeBackend(cost=10.0)  # each timing and each verification: 5 s of the fake clock
    result = tune.tune(spec, backend, budget_s=12, clock=backend.clock)
    tried = [n for n, v in result.record["variants"].items() if "skipped" not in v]
    skipped = [n for n, v in result.record["variants"].items() if v.get("skipped")]
    assert tried == ["default", "regs16"]  # 10 s spent + ~5 s for the next > 12 s
    assert skipped and result.record["complete"] is False
    assert result.record["spent_s"] == pytest.approx(15.0)  # two timings, one verification past the budget
    assert any("time budget" in note for note in result.notes)


def test_when_every_timed_variant_fails_the_skipped_ones_are_tried_past_the_budget(op_path):
    spec = load_spec(op_path)
    backend = FakeBackend(failing={"default"}, cost=10.0)
    result = tune.tune(spec, backend, budget_s=1, clock=backend.clock)
    assert result.variant == "regs16"  # default failed; one more was tried past the budget
    assert result.record["variants"]["regs16"]["verified"]
    assert not any(n == "regs16" for n in result.record["variants"] if result.record["variants"][n].get("skipped"))


def test_no_verified_variant_is_rejected(op_path):
    spec = load_spec(op_path)
    backend = FakeBackend(failing={v.name for v in VARIANTS})
    with pytest.raises(lock.Rejected, match="no builtin kernel variant passed verification"):
        tune.tune(spec, backend, clock=backend.clock)


def test_when_none_verifies_the_variants_set_aside_for_speed_are_tried_for_correctness(op_path):
    spec = load_spec(op_path)  # swiglu: no wide benchmark rows, so `kahan` (wide rows only) is set aside
    first, notes = tune.candidates(spec)
    assert "kahan" not in [v.name for v, _ in first] and any("kahan" in n for n in notes)
    backend = FakeBackend(failing={v.name for v, _ in first})
    result = tune.tune(spec, backend, clock=backend.clock)
    verified = [n for n, r in result.record["variants"].items() if r.get("verified")]
    assert result.decision == tune.KERNEL and verified and result.variant in verified
    assert set(verified).isdisjoint(v.name for v, _ in first)
    assert any("for correctness" in n for n in result.notes)


def test_slower_than_eager_on_a_row_keeps_the_reference(op_path):
    spec = load_spec(op_path)
    decode = lambda row: row["dims"]["N"] == 64  # noqa: E731
    # every variant: twice eager's speed on the big shape, 0.8x eager at decode size
    backend = FakeBackend(kernel_us=lambda v, row: 10.0 if decode(row) else 100.0,
                          eager_us=lambda row: 8.0 if decode(row) else 200.0)
    result = tune.tune(spec, backend, clock=backend.clock)
    assert result.decision == tune.REFERENCE and result.benchmark is None
    slow = result.slower_rows
    assert slow and all("N=64" in r["id"] for r in slow) and all(r["speedup_vs_eager"] == 0.8 for r in slow)
    assert "slower than eager PyTorch on 6 of 12 benchmark rows" in result.record["reason"]
    assert not any(kind == "benchmark" for kind, _ in backend.calls)
    assert [kind for kind, _ in backend.calls].count("eager") == 2  # confirmed by a second timing


def test_a_row_slower_by_noise_in_the_first_timing_is_confirmed_by_a_second(op_path):
    spec = load_spec(op_path)
    backend = FakeBackend()

    def kernel_us(variant, row):  # a variant's first timing at decode size was an unlucky run
        if row["dims"]["N"] != 64:
            return 100.0
        return 12.0 if backend.calls.count(("time", variant)) <= 1 else 9.0

    backend.kernel_us = kernel_us
    backend.eager_us = lambda row: 200.0 if row["dims"]["N"] != 64 else 10.0
    result = tune.tune(spec, backend, clock=backend.clock)
    assert result.decision == tune.KERNEL and any("timed again" in note for note in result.notes)
    assert all(r["kernel_us"] == 9.0 for r in result.record["rows"] if "N=64" in r["id"])


def test_within_noise_of_eager_ships_the_kernel(op_path):
    spec = load_spec(op_path)
    backend = FakeBackend(kernel_us=lambda v, row: 100.0, eager_us=lambda row: 98.0)  # 0.98x: noise
    assert tune.tune(spec, backend, clock=backend.clock).decision == tune.KERNEL


def test_a_variant_not_slower_than_eager_wins_over_a_faster_one_that_is(op_path):
    spec = load_spec(op_path)
    decode = lambda row: row["dims"]["N"] == 64  # noqa: E731

    def kernel_us(variant, row):  # regs16: fastest overall, but slower than eager at decode size
        if variant == "regs16":
            return 12.0 if decode(row) else 50.0
        return 9.0 if decode(row) else 100.0

    backend = FakeBackend(kernel_us=kernel_us, eager_us=lambda row: 10.0 if decode(row) else 200.0)
    result = tune.tune(spec, backend, clock=backend.clock)
    assert result.decision == tune.KERNEL and result.variant != "regs16"
    assert any("slower than eager" in note for note in result.notes)


def test_candidates_skip_variants_that_change_no_class_of_the_benchmark_rows():
    spec = load_spec(SPECS / "swiglu.yaml")
    pairs, notes = tune.candidates(spec)
    names = [v.name for v, _ in pairs]
    assert names[0] == "default" and "loop1024" not in names  # no wide rows at op_path's shapes
    assert any("loop1024" in n for n in notes)
    assert len({tune._same(s) for _, s in pairs}) == len(pairs)  # each kernel text once


def test_the_key_changes_with_each_of_its_parts(monkeypatch, op_path):
    spec = load_spec(op_path)
    key = tune.tuning_key(spec, "sm_90")
    assert set(key) == {"spec_hash", "generator", "gpu_arch", "verifier_version"}
    assert tune.tuning_key(spec, "sm_100") != key
    monkeypatch.setattr("specgen.verify.VERIFIER_VERSION", "99")
    assert tune.tuning_key(spec, "sm_90")["verifier_version"] == "99"


# ---------------------------------------------------------------------------- specgen generate

@pytest.fixture
def gpu(monkeypatch):
    """A GPU as far as the lock is concerned, and the fake backend in place of the real one."""
    monkeypatch.setattr(lock, "gpu_available", lambda: True)
    holder = {}

    def make_backend(arch=None, *, sanitize=False):
        return holder["backend"]

    monkeypatch.setattr(tune, "make_backend", make_backend)
    return holder


def _generate(path, *extra) -> int:
    return cli.main(["generate", str(path), *extra])


def test_generate_tunes_records_the_variant_and_timings_then_reuses_them(gpu, op_path, capsys):
    gpu["backend"] = FakeBackend(kernel_us=lambda v, row: {"cl256": 80.0}.get(v, 100.0))
    assert _generate(op_path, "--tune-budget", "500") == 0
    out = capsys.readouterr().out
    assert "autotuning on sm_90 within 500 s" in out and "chosen: variant cl256" in out
    assert "decision: ship the kernel" in out
    spec = load_spec(op_path)
    entry = lock.Lock.for_spec(spec).entry("swiglu")
    assert entry.tuning["variant"] == "cl256" and entry.tuning["decision"] == "kernel"
    assert entry.tuning["key"] == tune.tuning_key(spec, "sm_90")
    assert len(entry.tuning["rows"]) == _rows(spec)
    assert entry.tuning["variants"]["default"]["rows"][0]["kernel_us"] == 100.0
    assert entry.records[0].verification["variant"] == "cl256" and entry.records[0].benchmark["rows"]
    assert "// Schedule variant: cl256." in (op_path.parent / "kernels" / "swiglu.cu").read_text()

    gpu["backend"] = NoGpuCalls()  # nothing changed: no verification, no timing
    assert _generate(op_path, "--json", str(op_path.parent / "out.json")) == 0
    out = capsys.readouterr().out
    import json

    outcome = json.loads((op_path.parent / "out.json").read_text())["specs"][0]
    assert outcome["tuning"]["variant"] == "cl256" and outcome["tuning"]["decision"] == "kernel"
    assert "tuning reused from the lock" in out and "chosen: variant cl256" in out
    assert lock.Lock.for_spec(spec).entry("swiglu").created == entry.created


@pytest.mark.parametrize("change", ["arch", "generator", "verifier", "spec", "retune"])
def test_generate_retunes_when_the_key_changes(gpu, op_path, monkeypatch, capsys, change):
    gpu["backend"] = FakeBackend()
    assert _generate(op_path) == 0
    backend = gpu["backend"] = FakeBackend(arch="sm_100" if change == "arch" else "sm_90")
    extra = []
    if change == "generator":
        monkeypatch.setattr(tune, "generator_fingerprint", lambda: "another-generator")
    elif change == "verifier":
        monkeypatch.setattr("specgen.verify.VERIFIER_VERSION", "99")
    elif change == "spec":
        op_path.write_text(op_path.read_text().replace("{N: 64, H: 4096}", "{N: 64, H: 2048}"))
    elif change == "retune":
        extra = ["--retune"]
    assert _generate(op_path, *extra) == 0
    assert any(kind == "verify" for kind, _ in backend.calls)
    out = capsys.readouterr().out
    assert "autotuning on" in out and "tuning reused" not in out
    entry = lock.Lock.for_spec(load_spec(op_path)).entry("swiglu")
    assert entry.tuning["key"] == tune.tuning_key(load_spec(op_path), backend.arch)


def test_generate_keeps_the_reference_when_slower_than_eager_and_reuses_that(gpu, op_path, capsys):
    gpu["backend"] = FakeBackend()
    assert _generate(op_path) == 0
    kernel = op_path.parent / "kernels" / "swiglu.cu"
    assert kernel.exists()
    gpu["backend"] = FakeBackend(eager_us=lambda row: 50.0)  # eager now twice as fast
    assert _generate(op_path, "--retune") == 1  # no kernel for this op: as when an agent finds none
    out = capsys.readouterr().out
    assert "decision: keep the reference path" in out and "reference path" in out
    assert "SLOWER than eager" in out
    entry = lock.Lock.for_spec(load_spec(op_path)).entry("swiglu")
    assert not entry.kernel and "slower than eager" in entry.reference
    assert entry.tuning["decision"] == "reference" and entry.tuning["rows"][0]["eager_us"] == 50.0
    assert not kernel.exists()  # the lock's own (slower) kernel is removed

    gpu["backend"] = NoGpuCalls()
    assert _generate(op_path) == 1
    assert "tuning reused" in capsys.readouterr().out


def test_generate_never_replaces_a_hand_edited_kernel_when_keeping_eager(gpu, op_path, capsys):
    gpu["backend"] = FakeBackend()
    assert _generate(op_path) == 0
    kernel = op_path.parent / "kernels" / "swiglu.cu"
    kernel.write_text(kernel.read_text() + "// tuned by hand\n")
    gpu["backend"] = FakeBackend(eager_us=lambda row: 50.0)
    assert _generate(op_path) != 0  # refused before any GPU time: a hand-edited kernel
    assert not any(kind == "verify" for kind, _ in gpu["backend"].calls)
    assert kernel.read_text().endswith("// tuned by hand\n")


def test_no_tune_and_no_gpu_take_the_untuned_path(monkeypatch, op_path):
    import specgen.commands.generate as generate

    called = []
    monkeypatch.setattr(tune, "make_backend", lambda *a, **k: called.append(1) or None)
    monkeypatch.setattr(generate, "tune_one", lambda *a, **k: pytest.fail("tuned without a backend"))
    spec = load_spec(op_path)
    args = cli.build_parser().parse_args(["generate", str(op_path), "--no-tune"])
    monkeypatch.setattr("specgen.agents.loop.run_loop", lambda *a, **k: pytest.fail("stop here"))
    from specgen.agents.builtin import BuiltinAgent

    with pytest.raises(pytest.fail.Exception, match="stop here"):
        generate.generate_one(spec, BuiltinAgent(), args, _console())
    assert called == []  # --no-tune: the backend is not even asked for
    args = cli.build_parser().parse_args(["generate", str(op_path)])
    with pytest.raises(pytest.fail.Exception, match="stop here"):
        generate.generate_one(spec, BuiltinAgent(), args, _console())
    assert called == [1]  # asked, none (no GPU): the loop's default variant


def _console():
    from rich.console import Console

    return Console(file=open("/dev/null", "w"))


# ---------------------------------------------------------------------------- specgen build

def _resolve(path, *extra):
    from specgen.commands import build, load_specs

    args = cli.build_parser().parse_args(["build", str(path), *extra])
    return build._resolve(load_specs([str(path)]), args, _console())


def test_build_tunes_then_reuses_and_retunes_a_legacy_builtin_kernel(gpu, op_path, monkeypatch):
    monkeypatch.setattr("specgen.commands.build._gpu_arch", lambda: "sm_90")
    gpu["backend"] = FakeBackend()
    [result] = _resolve(op_path)
    assert result.kernel is not None and result.action == "generated"
    gpu["backend"] = NoGpuCalls()
    [result] = _resolve(op_path)
    assert result.action == "reused" and result.kernel is not None
    # a builtin kernel locked before tuning existed (no tuning record): tuned on this GPU
    spec = load_spec(op_path)
    entry = lock.Lock.for_spec(spec).entry("swiglu")
    the_lock = lock.Lock.for_spec(spec)
    the_lock.entries["swiglu"].tuning = None
    the_lock._write_lock()
    gpu["backend"] = FakeBackend()
    [result] = _resolve(op_path)
    assert any(kind == "verify" for kind, _ in gpu["backend"].calls) and result.kernel is not None
    assert lock.Lock.for_spec(spec).entry("swiglu").tuning["key"] == entry.tuning["key"]
    gpu["backend"] = NoGpuCalls()
    [result] = _resolve(op_path, "--no-tune")  # --no-tune: a fresh kernel is reused, whatever its record
    assert result.action == "reused"


def test_build_packages_the_reference_when_the_tuner_keeps_eager(gpu, op_path, monkeypatch):
    monkeypatch.setattr("specgen.commands.build._gpu_arch", lambda: "sm_90")
    gpu["backend"] = FakeBackend(eager_us=lambda row: 50.0)
    [result] = _resolve(op_path)
    assert result.kernel is None and result.action == "kept eager"
    assert "slower than eager" in result.provenance["note"]
    gpu["backend"] = NoGpuCalls()
    [result] = _resolve(op_path)
    assert result.kernel is None and result.action == "reused"


def test_a_tuning_record_needs_a_gpu(op_path, monkeypatch):
    monkeypatch.setattr(lock, "gpu_available", lambda: False)
    spec = load_spec(op_path)
    with pytest.raises(lock.LockError, match="tuning record"):
        lock.write_reference(spec, "builtin", "slower", tuning={"key": {}})


# ---------------------------------------------------------------------------- the real backend's wiring

@pytest.fixture
def standins(monkeypatch):
    """Stand-ins of verify_kernel, bench_spec, benchmark_kernel and the compiler, recording
    their calls (the calls and the row layout the tuner reads; the GPU test runs the real ones)."""
    from types import SimpleNamespace

    import specgen.bench as bench
    import specgen.verify as verify
    from specgen.agents.builtin import generator

    calls = []
    monkeypatch.setattr("specgen.toolchain.detect_gpu_arch", lambda: "sm_90")
    monkeypatch.setattr(generator, "compile_source",
                        lambda spec, source, arch=None: SimpleNamespace(library=Path("/x/lib.so"), arch="sm_90",
                                                                        source=source))
    # (unsigned_char: the variants' second builds for verifier 16's char_abi, compiled with them)
    monkeypatch.setattr(generator, "compile_many",
                        lambda jobs, unsigned_char=False: calls.append(("compile", len(jobs))) if unsigned_char else
                        calls.append(("compile without the unsigned-char builds", len(jobs))))

    def verify_kernel(spec, source, **options):
        calls.append(("verify", options))
        example = SimpleNamespace(describe=lambda: "forward N=3 float32 (tiny values, seed 7)") if "bad" in source else None
        return SimpleNamespace(passed="bad" not in source, reason="wrong_output", detail="at [0]", cases=9,
                               counterexample=example, tolerances={}, timings={},
                               to_json=lambda: {"passed": True, "cases": 9, "log": "..."})

    def bench_spec(spec, library, shapes=None, dtypes=None, *, eager=True, compiled=True, reps=40,
                   directions=("forward",), **_):
        calls.append(("bench", library is not None, eager, compiled, reps, directions))
        rows = [bench.BenchRow(spec.name, dict(d), t, 1, 1.0, 1.0, direction=r,
                               kernel_us=5.0 if library else None, eager_us=7.0 if eager else None)
                for d in spec.benchmark for t in spec.dtypes for r in directions]
        return bench.BenchResult(spec.name, "fake", 1.0, rows)

    monkeypatch.setattr(verify, "verify_kernel", verify_kernel)
    monkeypatch.setattr(bench, "bench_spec", bench_spec)
    monkeypatch.setattr(bench, "benchmark_kernel", lambda spec, library: bench_spec(spec, library))
    return calls


def test_gpu_backend_wires_the_verifier_and_the_bench(standins, op_path):
    calls = standins
    spec = load_spec(op_path)
    backend = tune.GpuBackend(sanitize=True)
    assert backend.arch == "sm_90"
    backend.prepare(spec, ["a", "b"])
    ok, bad = backend.verify(spec, "good"), backend.verify(spec, "bad")
    assert ok.passed and ok.record == {"passed": True, "cases": 9, "sanitized": True}
    assert not bad.passed  # the counterexample is in the reason the user and the rejection see
    assert bad.reason == "wrong_output: at [0]; counterexample: forward N=3 float32 (tiny values, seed 7)"
    assert calls[1] == ("verify", {"arch": None, "sanitize": True})
    kernel_rows = backend.time_kernel(spec, "good")
    eager_rows = backend.time_eager(spec)
    assert len(kernel_rows) == len(eager_rows) == _rows(spec)
    assert [tune.row_id(r) for r in kernel_rows] == [tune.row_id(r) for r in eager_rows]
    assert kernel_rows[0]["kernel_us"] == 5.0 and eager_rows[0]["eager_us"] == 7.0
    assert ("bench", True, False, False, tune.TIMING_REPS, ("forward", "backward")) in calls
    assert ("bench", False, True, False, tune.TIMING_REPS, ("forward", "backward")) in calls
    assert backend.benchmark(spec, "good")["rows"][0]["speedup_vs_eager"] == pytest.approx(7 / 5)
    assert calls[0] == ("compile", 2)


def test_generate_builtin_runs_the_same_tuner_without_a_budget(standins, op_path, monkeypatch):
    """benchmarks/builtin_bench.py's entry point: every variant asked for, the verdicts and
    timings per variant, the lock written with the tuning record."""
    from specgen.agents.builtin import generate_builtin
    from specgen.agents.builtin.schedule import variants_named

    monkeypatch.setattr(lock, "gpu_available", lambda: True)
    spec = load_spec(op_path)
    result = generate_builtin(spec, gpu=True, variants=variants_named("default,cl256"))
    assert set(result.timings) == {"default", "cl256"}  # both timed; verified fastest first until one passes
    assert result.variant in result.verdicts and set(result.verdicts) <= {"default", "cl256"}
    assert result.variant in ("default", "cl256") and result.record.verification["variant"] == result.variant
    entry = lock.Lock.for_spec(spec).entry("swiglu")
    assert entry.tuning["variant"] == result.variant and entry.tuning["key"]["gpu_arch"] == "sm_90"
    assert entry.tuning["budget_s"] is None and "Infinity" not in (op_path.parent / "specgen.lock").read_text()
    assert "(no budget)" in tune.summary_lines(entry.tuning)[0]
    assert entry.records[0].benchmark["rows"]


def test_last_times_variants_are_tried_right_after_the_default(op_path):
    from types import SimpleNamespace

    spec = load_spec(op_path)
    entry = SimpleNamespace(tuning=None, records=[SimpleNamespace(verification={"variant": "medium:cl256+wide:x"})])
    assert tune.previous_variants(entry) == ["cl256", "x"]
    pairs, _ = tune.candidates(spec, prefer=tune.previous_variants(entry))
    assert [v.name for v, _ in pairs][:2] == ["default", "cl256"]
    backend = FakeBackend(cost=10.0)
    result = tune.tune(spec, backend, budget_s=12, clock=backend.clock, prefer=["cl256"])
    assert [n for n, v in result.record["variants"].items() if "skipped" not in v] == ["default", "cl256"]


def _combined_times(spec, fast: dict[str, str], slow_combination: bool = False):
    """kernel_us(variant, row): 100 us, 60 us for the variant `fast` names for the row's shape
    class; a combination ("medium:a+split:b") takes each class's time from its part."""
    from specgen.agents.builtin.generator import shape_class_of

    def kernel_us(variant, row):
        cls = shape_class_of(spec, row["direction"], row["dims"], row["dtype"])
        if ":" in variant:
            if slow_combination:
                return 500.0
            variant = dict(part.split(":") for part in variant.split("+")).get(cls, "default")
        return 60.0 if fast.get(cls) == variant else 100.0

    return kernel_us


def test_per_class_winners_are_combined_verified_and_timed(tmp_path):
    shutil.copy(SPECS / "softmax.yaml", tmp_path / "softmax.yaml")
    spec = load_spec(tmp_path / "softmax.yaml")
    backend = FakeBackend(kernel_us=_combined_times(spec, {"medium": "twopass", "split": "nosplit"}))
    result = tune.tune(spec, backend, budget_s=10_000, clock=backend.clock)
    assert ":" in result.variant and "medium:twopass" in result.variant and "split:nosplit" in result.variant
    assert ("verify", result.variant) in backend.calls and ("time", result.variant) in backend.calls
    assert result.record["variants"][result.variant]["verified"]
    assert f"// Schedule variant: {result.variant}." in result.source


def test_a_combination_slower_than_the_best_single_variant_is_not_kept(tmp_path):
    shutil.copy(SPECS / "softmax.yaml", tmp_path / "softmax.yaml")
    spec = load_spec(tmp_path / "softmax.yaml")
    backend = FakeBackend(kernel_us=_combined_times(spec, {"medium": "twopass", "split": "nosplit"},
                                                    slow_combination=True))
    result = tune.tune(spec, backend, budget_s=10_000, clock=backend.clock)
    assert result.variant in ("twopass", "nosplit")
    assert any("slower than" in note and "over all rows" in note for note in result.notes)


def test_a_spec_without_benchmark_shapes_gets_the_default_variant_verified(op_path):
    text = op_path.read_text()
    op_path.write_text(text[:text.index("benchmark:")])
    spec = load_spec(op_path)
    backend = FakeBackend()
    result = tune.tune(spec, backend, clock=backend.clock)
    assert result.variant == "default" and result.decision == tune.KERNEL and result.record["rows"] == []
    assert [kind for kind, _ in backend.calls] == ["verify"]
    assert "  default: verified, not timed (no benchmark shapes)" in tune.summary_lines(result.record)


def test_another_agents_locked_kernel_is_kept_when_faster_or_when_the_builtin_is_slower_than_eager(
        gpu, op_path, capsys):
    spec = load_spec(op_path)
    llm = "// by an LLM\n" + tune.candidates(spec)[0][0][1]  # a distinct source (the fake times it as default)
    gpu["backend"] = FakeBackend()
    lock.write_kernel(spec, llm.replace("// by an LLM", "// Schedule variant: llm."), agent="openai",
                      model="gpt")
    kernel = op_path.parent / "kernels" / "swiglu.cu"
    before = kernel.read_text()
    gpu["backend"] = FakeBackend(kernel_us=lambda v, row: 50.0 if v == "llm" else 100.0)
    _generate(op_path)  # exit 1 all the same: that kernel has no verification record
    assert "kept the locked kernel by openai: it is faster" in capsys.readouterr().out
    assert kernel.read_text() == before
    gpu["backend"] = FakeBackend(eager_us=lambda row: 50.0)  # the builtin kernels lose to eager
    _generate(op_path)
    assert "kept the locked kernel by openai" in capsys.readouterr().out
    assert kernel.read_text() == before and lock.Lock.for_spec(spec).entry("swiglu").agent == "openai"


def test_build_retries_a_reference_entry_from_before_tuning_only_when_the_generator_lowers_it(
        gpu, op_path, monkeypatch):
    monkeypatch.setattr("specgen.commands.build._gpu_arch", lambda: "sm_90")
    shutil.copy(SPECS / "linear_bias_relu.yaml", op_path.parent / "linear_bias_relu.yaml")
    for name in ("swiglu", "linear_bias_relu"):
        lock.write_reference(load_spec(op_path.parent / f"{name}.yaml"), "builtin", "the builtin agent refused: ...")
    gpu["backend"] = FakeBackend()
    results = {r.spec.name: r for r in _resolve(op_path.parent)}
    assert results["swiglu"].kernel is not None and results["swiglu"].action == "generated"
    assert results["linear_bias_relu"].kernel is None and results["linear_bias_relu"].action == "reused"
    assert {name for kind, name in gpu["backend"].calls if kind == "verify"} >= {"default"}


def test_no_verified_variant_is_a_spec_without_a_kernel_not_a_crash(gpu, op_path, capsys, monkeypatch):
    gpu["backend"] = FakeBackend(failing={v.name for v in VARIANTS})
    assert _generate(op_path) == 1
    assert "no kernel for swiglu" in capsys.readouterr().out
    monkeypatch.setattr("specgen.commands.build._gpu_arch", lambda: "sm_90")
    [result] = _resolve(op_path)
    assert result.kernel is None and result.action == "no kernel"


def test_the_combined_kernel_takes_each_class_from_its_winner():
    """cross-entropy: `twopass` fastest on medium rows, `nosplit` on split rows; the kept kernel
    has both (the source says so), and was verified and timed itself."""
    from specgen.agents.builtin.schedule import variants_named

    spec = load_spec(SPECS / "cross_entropy.yaml")
    backend = FakeBackend(kernel_us=_combined_times(spec, {"medium": "twopass", "split": "nosplit"}))
    result = tune.tune(spec, backend, budget_s=10_000, clock=backend.clock,
                       variants=variants_named("default,twopass,nosplit"))
    assert "medium:twopass" in result.variant and "split:nosplit" in result.variant
    assert "exact two-pass form" in result.source
    assert "SG_LAUNCH_CL(VEC" not in result.source.split("#define SG_LAUNCH_CL")[-1]
    verified = [name for kind, name in backend.calls if kind == "verify"]
    assert {"twopass", "nosplit"} <= set(verified) and verified[-1] == result.variant
    assert len(verified) == len(set(verified))  # each verified once


def test_variants_that_give_the_same_kernel_are_tried_once():
    from specgen.agents.builtin.schedule import variants_named

    # csmem only changes programs with column partials: for softmax it is the default kernel
    pairs, _ = tune.candidates(load_spec(SPECS / "softmax.yaml"), variants_named("default,csmem"))
    assert [v.name for v, _ in pairs] == ["default"]


def test_generate_builtin_finds_the_verdict_of_a_source_without_the_variant_line(standins, op_path, monkeypatch):
    """Families outside the row emitter (arg-reductions, losses, channel norms) write no
    `// Schedule variant:` line: on the H200 every such problem ended in KeyError: 'default'."""
    from specgen.agents.builtin import generate_builtin, generator

    real = generator.build_source
    monkeypatch.setattr(generator, "build_source",
                        lambda spec, variant=generator.DEFAULT_VARIANT: tune._same(real(spec, variant)))
    monkeypatch.setattr(lock, "gpu_available", lambda: True)
    spec = load_spec(op_path)
    result = generate_builtin(spec, gpu=True, tune=False)
    assert "Schedule variant" not in result.source
    assert result.record.verification["variant"] == "default" and result.record.verification["passed"]


# ---------------------------------------------------------------------------- the sanitizer gate

class SanitizedBackend(FakeBackend):
    """compute-sanitizer over the chosen kernel: `finding` makes it report a race."""

    def __init__(self, finding: str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.finding = finding

    def sanitize_chosen(self, spec, source):
        from specgen.verify.verdict import SANITIZER, Failure

        self.calls.append(("sanitize", variant_of(source)))
        if self.finding:
            raise Failure(SANITIZER, self.finding)
        return {"memcheck": 9.8, "racecheck": 30.2, "initcheck": 8.2}


def test_the_chosen_kernel_runs_under_the_sanitizer_before_it_is_locked(gpu, op_path, capsys):
    gpu["backend"] = backend = SanitizedBackend(kernel_us=lambda v, row: {"cl256": 80.0}.get(v, 100.0))
    assert _generate(op_path) == 0
    assert [c for c in backend.calls if c[0] == "sanitize"] == [("sanitize", "cl256")]  # the chosen one, once
    assert "compute-sanitizer: nothing found (memcheck 10 s, racecheck 30 s, initcheck 8 s)" in capsys.readouterr().out
    record = lock.Lock.for_spec(load_spec(op_path)).entry("swiglu").records[0]
    assert record.verification["sanitized"] is True and record.verification["sanitize_s"]["racecheck"] == 30.2


def test_a_sanitizer_finding_locks_nothing(gpu, op_path, capsys):
    gpu["backend"] = SanitizedBackend(finding="compute-sanitizer racecheck reported errors on a small run: "
                                              "Race reported between Write access ... and Read access")
    assert _generate(op_path) == 1
    out = capsys.readouterr().out
    assert "not locked" in out and "racecheck reported errors" in out
    assert not (op_path.parent / "kernels" / "swiglu.cu").exists()
    assert lock.Lock.for_spec(load_spec(op_path)).entry("swiglu") is None


@pytest.mark.parametrize("flag, sanitized", [("--no-sanitize", False), ("--sanitize", True)])
def test_no_sanitize_and_sanitize_every_candidate_skip_the_gate(gpu, op_path, flag, sanitized):
    gpu["backend"] = backend = SanitizedBackend(finding="would refuse")
    assert _generate(op_path, flag) == 0
    assert not [c for c in backend.calls if c[0] == "sanitize"]
    assert lock.Lock.for_spec(load_spec(op_path)).entry("swiglu").records[0].verification["sanitized"] is sanitized


def test_without_a_sanitizer_the_kernel_is_locked_and_the_record_says_unsanitized(gpu, op_path, capsys):
    gpu["backend"] = FakeBackend()  # its sanitize_chosen(): None, as where compute-sanitizer is not installed
    assert _generate(op_path) == 0
    assert "no compute-sanitizer here: locked without it" in capsys.readouterr().out
    assert lock.Lock.for_spec(load_spec(op_path)).entry("swiglu").records[0].verification["sanitized"] is False


def test_gpu_backend_sanitizes_the_compiled_chosen_source(standins, op_path, monkeypatch):
    import specgen.verify.sanitize as sanitize

    seen = []
    monkeypatch.setattr(sanitize, "find_compute_sanitizer", lambda: Path("/cuda/bin/compute-sanitizer"))
    monkeypatch.setattr(sanitize, "run_sanitizer", lambda spec, library, seed=0: seen.append(library) or {"memcheck": 1.0})
    assert tune.GpuBackend().sanitize_chosen(load_spec(op_path), "good") == {"memcheck": 1.0}
    assert seen == [Path("/x/lib.so")]
    monkeypatch.setattr(sanitize, "find_compute_sanitizer", lambda: None)
    assert tune.GpuBackend().sanitize_chosen(load_spec(op_path), "good") is None


def _class_winners_times(spec, win: dict[str, str]):
    from specgen.agents.builtin.generator import shape_class_of

    def kernel_us(variant, row):
        cls = shape_class_of(spec, row["direction"], row["dims"], row["dtype"])
        if ":" in variant:
            variant = dict(p.split(":") for p in variant.split("+")).get(cls, "default")
        return 50.0 if win.get(cls) == variant else 100.0

    return kernel_us


def test_the_per_class_winners_are_not_verified_when_their_combination_is_over_the_budget():
    """Each class winner's verification is full size: with no budget left for them and their
    combination, none is verified for nothing (a review's repro, session 22)."""
    spec = load_spec(SPECS / "softmax.yaml")
    win = {"few": "fewtwo", "medium": "twopass", "split": "nosplit", "wide": "loop1024"}
    backend = FakeBackend(kernel_us=_class_winners_times(spec, win), cost=20.0)  # timing 10 s, verifying 10 s
    result = tune.tune(spec, backend, budget_s=60, clock=backend.clock)
    assert [name for kind, name in backend.calls if kind == "verify"] == [result.variant]
    assert result.record["spent_s"] <= 60 + 10 + 10  # the budget, one timing and one verification past it
    assert any("combination" in note and "not tried" in note for note in result.notes)


def test_a_combination_that_is_a_variant_already_timed_is_not_tried_again():
    """rmsnorm: fewblock wins the few-rows class, the default every other; their combination has
    the fields of fewblock itself, timed already: no second timing or verification."""
    from specgen.agents.builtin.schedule import variants_named

    spec = load_spec(SPECS / "rmsnorm.yaml")
    backend = FakeBackend(kernel_us=lambda v, row: 90.0 if "fewblock" in v else 100.0)
    result = tune.tune(spec, backend, budget_s=1e9, clock=backend.clock, variants=variants_named("default,fewblock"))
    assert result.variant == "fewblock"
    calls = [c for c in backend.calls if c[0] in ("verify", "time")]
    assert calls == [("time", "default"), ("time", "fewblock"), ("verify", "fewblock")]


def test_the_tuner_tries_the_fused_axis_kernel_for_channel_norms_only():
    """`axisfused` changes axis programs only: the tuner tries it for an InstanceNorm (a kernel
    text of its own) and drops it for a row program, whose text it leaves unchanged."""
    norm = load_spec(Path(__file__).resolve().parent.parent / "benchmarks" / "level1" / "specs" / "instance_norm.yaml")
    names = [v.name for v, _ in tune.candidates(norm)[0]]
    assert names[0] == "default" and "axisfused" in names
    rows = [v.name for v, _ in tune.candidates(load_spec(SPECS / "swiglu.yaml"))[0]]
    assert "axisfused" not in rows


def test_structure_first_puts_the_variants_written_for_the_layout_after_the_default():
    """A small budget (60 s a problem in the held-out runs) times two or three variants: an
    InstanceNorm reached neither fused axis variant in VARIANTS order (session 34)."""
    reduce_specs = Path(__file__).resolve().parent / "reduce_specs"
    trailing = [v.name for v, _ in tune.candidates(load_spec(reduce_specs / "instance_norm_affine_fwd.yaml"))[0]]
    assert trailing[:4] == ["default", "axisfusedmom", "axisfused", "moments"]
    inner = [v.name for v, _ in tune.candidates(load_spec(reduce_specs / "mean_dim1_4d.yaml"))[0]]
    assert inner[:4] == ["default", "axiselemvec", "axistree", "axisbatch"]
    loss = [v.name for v, _ in tune.candidates(load_spec(reduce_specs / "mse_loss.yaml"))[0]]
    # everything reduced: no kept element to fuse a row for; the sweep's reads batched first
    assert loss[:3] == ["default", "axisbatch", "axistree"]
    # the lock's previous winners still come first; a row program keeps the VARIANTS order
    again = [v.name for v, _ in tune.candidates(load_spec(reduce_specs / "instance_norm_affine_fwd.yaml"),
                                                 prefer=["axistree"])[0]]
    assert again[:3] == ["default", "axistree", "axisfusedmom"]
    assert tune.structure_first(load_spec(SPECS / "softmax.yaml")) == []
    rows = [v.name for v, _ in tune.candidates(load_spec(SPECS / "softmax.yaml"))[0]]
    order = [v.name for v in tune.VARIANTS]
    assert rows == sorted(rows, key=order.index)
