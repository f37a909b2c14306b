"""The level-1 suite on the CPU: every spec of the development suite (benchmarks/level1/specs)
and of the held-out sets (heldout/problems, problems-v2, problems-v3, problems-v4, problems-v5, problems-v6, problems-v7,
problems-v8, problems-v9) passes `specgen check`;
the benchmark's row and summary logic (benchmarks/level1_bench.py) on fabricated timings; and
which development specs the built-in generator lowers today, against
benchmarks/level1/EXPECTED_REFUSALS.txt.

The held-out specs are only checked here (never lowered, never listed in a message): the
generator's developers must not read them (heldout/problems/README.md)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from specgen.checking import check_spec

REPO = Path(__file__).resolve().parent.parent
DEV = REPO / "benchmarks" / "level1" / "specs"
HELDOUT = REPO / "heldout" / "problems"
HELDOUT_V2 = REPO / "heldout" / "problems-v2"  # written in session 17 (a family outside #12's list: pool)
HELDOUT_V3 = REPO / "heldout" / "problems-v3"  # written in session 20
HELDOUT_V4 = REPO / "heldout" / "problems-v4"  # written by a helper session (counts only in its README)
HELDOUT_V5 = REPO / "heldout" / "problems-v5"  # written by a helper in session 23 (counts only in its README)
HELDOUT_V6 = REPO / "heldout" / "problems-v6"  # written by a helper in session 25 (counts only in its README)
HELDOUT_V7 = REPO / "heldout" / "problems-v7"  # written by a helper in session 29, not yet run (not read)
HELDOUT_V8 = REPO / "heldout" / "problems-v8"  # written by a helper in session 36 (counts only in its README)
HELDOUT_V9 = REPO / "heldout" / "problems-v9"  # written by a helper in session 37 (counts only in its README)
EXPECTED_REFUSALS = REPO / "benchmarks" / "level1" / "EXPECTED_REFUSALS.txt"
FAMILIES = {"pointwise", "reduce_last", "reduce_middle", "reduce_multi", "reduce_all", "reduce_first", "arg_reduce",
            "scan", "row_norm", "channel_norm", "loss", "pool"}


def _bench():
    spec = importlib.util.spec_from_file_location("level1_bench", REPO / "benchmarks" / "level1_bench.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("level1_bench", module)
    spec.loader.exec_module(module)
    return module


bench = _bench()


# ------------------------------------------------------------------ the specs

def test_suites_are_large_enough_and_every_spec_has_a_family():
    dev, held, v2, v3, v4, v5, v6, v7, v8, v9 = (sorted(folder.glob("*.yaml")) for folder in
                                                 (DEV, HELDOUT, HELDOUT_V2, HELDOUT_V3, HELDOUT_V4, HELDOUT_V5,
                                                  HELDOUT_V6, HELDOUT_V7, HELDOUT_V8, HELDOUT_V9))
    assert len(dev) >= 40 and len(held) >= 12 and len(v2) >= 12 and len(v3) >= 14 and len(v4) >= 16
    assert len(v5) >= 18 and len(v6) >= 20 and len(v7) >= 20 and len(v8) >= 24 and len(v9) >= 24
    # counts only: a failure must not print held-out names (pytest shows the sets it compares;
    # a development problem's author saw six held-out names that way, session 21)
    clashes = [len({p.stem for p in a} & {p.stem for p in b})
               for a, b in ((dev, held + v2 + v3 + v4 + v5 + v6 + v7 + v8 + v9), (held, v2), (held + v2, v3),
                            (held + v2 + v3, v4), (held + v2 + v3 + v4, v5), (held + v2 + v3 + v4 + v5, v6),
                            (held + v2 + v3 + v4 + v5 + v6, v7), (held + v2 + v3 + v4 + v5 + v6 + v7, v8),
                            (held + v2 + v3 + v4 + v5 + v6 + v7 + v8, v9))]
    assert clashes == [0] * 9, (
        f"problem names repeated (development vs held-out, then each held-out set vs the earlier ones): "
        f"{clashes}; rename the newer problem (held-out names are not printed)")
    for path in dev:
        assert bench.spec_family(path) in FAMILIES, f"{path.name}: first line must be '# family: NAME'"
    unfamiliar = sum(bench.spec_family(path) not in FAMILIES for path in held + v2 + v3 + v4 + v5 + v6 + v7 + v8 + v9)
    assert unfamiliar == 0, f"{unfamiliar} held-out spec(s) without a '# family: NAME' first line"
    counts = {}
    for path in dev:
        counts[bench.spec_family(path)] = counts.get(bench.spec_family(path), 0) + 1
    assert counts["pointwise"] >= 10 and counts["loss"] >= 8 and counts["scan"] >= 5
    modules = [p for p in dev if "nn.Module" in p.read_text() and "nn." in p.read_text().split("reference:", 1)[1]]
    assert len(modules) >= 2, "at least two references build an nn.Module with parameters"


def test_every_spec_passes_check():
    from specgen.sandbox import shared_sandbox

    sandbox = shared_sandbox()
    failures = []
    for path in (sorted(DEV.glob("*.yaml")) + sorted(HELDOUT.glob("*.yaml")) + sorted(HELDOUT_V2.glob("*.yaml"))
                 + sorted(HELDOUT_V3.glob("*.yaml")) + sorted(HELDOUT_V4.glob("*.yaml"))
                 + sorted(HELDOUT_V5.glob("*.yaml")) + sorted(HELDOUT_V6.glob("*.yaml"))
                 + sorted(HELDOUT_V7.glob("*.yaml")) + sorted(HELDOUT_V8.glob("*.yaml"))
                 + sorted(HELDOUT_V9.glob("*.yaml"))):
        result = check_spec(path, samples=1, sandbox=sandbox)
        if not result.ok:
            failures.append(f"{path.relative_to(REPO)}: {result.error}")
        else:
            assert result.spec.name == path.stem, f"{path.name}: the file is named after the op"
            assert result.spec.benchmark, f"{path.name}: no benchmark shapes"
    assert not failures, "\n".join(failures)


def test_benchmark_shapes_have_large_and_decode_sizes():
    from specgen.spec import load_spec

    for path in sorted(DEV.glob("*.yaml")):
        spec = load_spec(path)
        classes = {bench.size_class(spec, dims) for dims in spec.benchmark}
        assert classes == {"decode", "large"}, f"{spec.name}: {classes}"
        largest = max(max(bench.tensor_sizes(spec, dims, "float32")) for dims in spec.benchmark)
        assert 1e9 <= largest <= 13e9, f"{spec.name}: largest tensor {largest / 1e9:.1f} GB"


def test_development_suite_lowers_as_expected():
    """Which specs the built-in generator refuses today; EXPECTED_REFUSALS.txt is updated as
    families land (delete the names a new family lowers)."""
    from specgen.agents.base import AgentRefused
    from specgen.agents.builtin import build_source
    from specgen.spec import load_spec

    expected = {line.strip() for line in EXPECTED_REFUSALS.read_text().splitlines()
                if line.strip() and not line.startswith("#")}
    refused, lowered = set(), set()
    for path in sorted(DEV.glob("*.yaml")):
        spec = load_spec(path)
        try:
            build_source(spec)
            lowered.add(spec.name)
        except AgentRefused as refusal:
            refused.add(spec.name)
            assert "agent" in str(refusal), f"{spec.name}: a refusal points to the LLM agents"
    print(f"\nlevel-1 development suite: {len(lowered)} lowered, {len(refused)} refused of {len(lowered | refused)}")
    assert not expected - lowered - refused, f"names in EXPECTED_REFUSALS.txt without a spec: {expected - lowered - refused}"
    assert refused == expected, (f"now lowered (delete from EXPECTED_REFUSALS.txt): {sorted(expected - refused)}; "
                                 f"now refused (a regression?): {sorted(refused - expected)}")


# ------------------------------------------------------------------ the benchmark's logic, fabricated timings

def row(kernel=100.0, eager=100.0, compile_=100.0, family="pointwise", gb=2.0, largest=None, dtype="float32",
        fallback=None, status="timed"):
    return {"name": "op", "family": family, "status": status, "direction": "forward", "dims": {"N": 1},
            "dtype": dtype, "bytes": int(gb * 1e9), "largest_bytes": int((largest if largest is not None else gb / 2) * 1e9),
            "kernel_us": kernel, "eager_us": eager, "compile_us": compile_, "compile_fallback": fallback}


NEG = {"float32": 4000.0, "bfloat16": 3900.0}


def evaluated(**kw):
    return bench.evaluate_row(row(**kw), NEG, 4800.0)


def test_eager_target_is_097():
    assert evaluated(kernel=100.0, eager=96.0)["meets"]["eager"] is False  # 0.96x eager
    assert evaluated(kernel=100.0, eager=97.0)["meets"]["eager"] is True  # 0.97x eager
    faster = evaluated(kernel=50.0, eager=100.0)
    assert faster["x_eager"] == pytest.approx(2.0) and faster["meets"]["eager"]
    missed = evaluated(kernel=100.0, eager=96.0)
    assert any("0.96x eager" in m for m in missed["misses"])


def test_compile_target_and_fallback_rows():
    assert evaluated(kernel=100.0, compile_=96.9)["meets"]["compile"] is False
    assert evaluated(kernel=100.0, compile_=97.0)["meets"]["compile"] is True
    fell_back = evaluated(kernel=100.0, compile_=50.0, fallback="dynamo compiled no frame")
    assert fell_back["meets"]["compile"] is None  # not counted either way
    assert any("fell back" in m for m in fell_back["misses"])


def test_bandwidth_target_against_neg():
    # 2 GB moved in 500 us = 4000 GB/s = 100% of the float32 neg() bandwidth
    at = evaluated(kernel=500.0, eager=500.0, compile_=500.0, gb=2.0)
    assert at["neg_fraction"] == pytest.approx(1.0) and at["meets"]["bandwidth"] is True
    assert at["hbm_fraction"] == pytest.approx(4000 / 4800)
    below = evaluated(kernel=500.0 / 0.979, eager=600.0, compile_=600.0, gb=2.0)  # 97.9% of neg
    assert below["meets"]["bandwidth"] is False and below["meets"]["eager"] is True
    assert evaluated(kernel=500.0 / 0.98, eager=600.0, compile_=600.0, gb=2.0)["meets"]["bandwidth"] is True
    # per dtype: the bfloat16 row is held to the bfloat16 neg()
    bf16 = evaluated(kernel=500.0, eager=500.0, compile_=500.0, gb=1.95, largest=1.0, dtype="bfloat16")
    assert bf16["neg_fraction"] == pytest.approx(3900 / 3900)
    # small rows and other families: no bandwidth target
    assert evaluated(gb=0.5, largest=0.25)["meets"]["bandwidth"] is None
    assert evaluated(family="reduce_middle", gb=4.0)["meets"]["bandwidth"] is None
    assert evaluated(family="reduce_last", gb=4.0, largest=4.0, kernel=2000.0, eager=2000.0,
                     compile_=2000.0)["meets"]["bandwidth"] is False  # 2000 GB/s: 50% of neg


def test_row_without_kernel_time_misses():
    missing = evaluated(kernel=None)
    assert missing["meets"]["eager"] is False and missing["misses"]


def test_summary_targets():
    problems = [{"name": f"p{i}", "family": "pointwise", "status": "verified", "lowered": True, "verified": True}
                for i in range(9)] + [{"name": "p9", "family": "loss", "status": "refused", "lowered": False,
                                       "verified": None}]
    rows = [evaluated(kernel=100.0, eager=110.0, compile_=110.0) for _ in range(9)]
    rows.append(evaluated(kernel=100.0, eager=110.0, compile_=90.0))  # 9/10 at the compile target
    s = bench.summarize(problems, rows)
    assert s["targets"]["lowered"]["ok"] is True  # 9/10 = 90%
    assert s["targets"]["compile"]["ok"] is True and s["targets"]["compile"]["value"] == pytest.approx(0.9)
    assert s["targets"]["eager"]["ok"] is True and s["targets"]["verified"]["ok"] is True
    assert s["refused"] == 1 and s["families"]["loss"]["lowered"] == 0 and s["families"]["pointwise"]["rows"] == 10

    rows.append(evaluated(kernel=100.0, eager=96.0, compile_=90.0))  # 0.96x eager: fails, and 9/11 compile
    problems.append({"name": "p10", "family": "scan", "status": "refused", "lowered": False, "verified": None})
    s = bench.summarize(problems, rows)
    assert s["targets"]["eager"]["ok"] is False
    assert s["targets"]["compile"]["ok"] is False  # 9/11 < 90%
    assert s["targets"]["lowered"]["ok"] is False  # 9/11 < 90%
    assert s["all_targets_met"] is False

    problems.append({"name": "p11", "family": "scan", "status": "not verified", "lowered": True, "verified": False})
    assert bench.summarize(problems, rows)["targets"]["verified"]["ok"] is False


def test_not_reached_rows_count_as_coverage_not_as_misses(tmp_path, capsys):
    problems = [{"name": "a", "family": "pointwise", "status": "verified", "lowered": True, "verified": True},
                {"name": "b", "family": "pointwise", "status": "not reached", "lowered": True, "verified": None}]
    rows = [evaluated(kernel=100.0, eager=100.0, compile_=100.0),
            {"name": "b", "family": "pointwise", "status": "not reached", "message": "budget", "dims": None}]
    s = bench.summarize(problems, rows)
    assert s["rows_timed"] == 1 and s["rows_not_reached"] == 1 and s["not_reached"] == 1
    assert s["targets"]["verified"]["ok"] is True and "not reached" in s["targets"]["verified"]["text"]
    assert s["all_targets_met"] is False  # a run that did not reach everything proves nothing
    report = {"specs_folder": "x", "environment": {"gpu": "fake", "neg_gbs": NEG}, "problems": problems, "rows": rows,
              "summary": s}
    bench.write_report(tmp_path, report)
    text = (tmp_path / "level1_bench.md").read_text()
    assert "NOT REACHED" in text and "| op |" in text
    bench.print_tables(report)
    out = capsys.readouterr().out
    assert "targets" in out and "NOT REACHED" in out
    bench.print_tables(report, summary_only=True)
    assert "NOT REACHED" not in capsys.readouterr().out


def test_merge_prefers_timed_rows(tmp_path):
    import json

    a = {"specs_folder": "dev", "environment": {}, "rows": [
        {"name": "x", "status": "not reached", "dims": {"N": 1}, "dtype": "float32", "direction": "forward"}],
        "problems": [{"name": "x", "family": "pointwise", "status": "not reached", "lowered": True, "verified": None}]}
    b = {"specs_folder": "dev", "environment": {}, "rows": [
        {**evaluated(kernel=90.0, eager=100.0, compile_=100.0), "name": "x", "dims": {"N": 1}}],
        "problems": [{"name": "x", "family": "pointwise", "status": "verified", "lowered": True, "verified": True}]}
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    merged = bench.merge([str(tmp_path / "a.json"), str(tmp_path / "b.json")])
    assert [r["status"] for r in merged["rows"]] == ["timed"]
    assert merged["problems"][0]["status"] == "verified" and merged["summary"]["targets"]["eager"]["ok"]


def test_selection_sizes_and_memory_estimate():
    from specgen.spec import load_spec

    paths = bench.find_specs([DEV], only=["relu", "cumsum", "nope"])
    assert [p.stem for p in paths] == ["cumsum", "relu"]
    everything = bench.find_specs([DEV])
    shards = [bench.find_specs([DEV], shard=(k, 3)) for k in (1, 2, 3)]
    assert sorted(p for s in shards for p in s) == everything
    lowering = {"cumsum": False, "relu": True, "tanh": True, "argmin_last": True}
    order = bench.run_order([DEV / f"{n}.yaml" for n in ("argmin_last", "cumsum", "relu", "tanh")], lowering)
    assert [p.stem for p in order] == ["cumsum", "argmin_last", "relu", "tanh"]  # refused first, then by family
    relu = load_spec(DEV / "relu.yaml")
    assert [bench.size_class(relu, d) for d in relu.benchmark] == ["large", "decode", "decode"]
    assert bench.select_shapes(relu, "decode") == [{"N": 8, "D": 4096}, {"N": 1, "D": 4096}]
    assert bench.select_shapes(relu, "large") == [{"N": 8192, "D": 262144}]
    # [8192, 262144] float32, 8.6 GB per tensor, one input set: the forward fits beside eager and compile on an
    # H200, the backward's checked timing (float64 autograd truth, gradients, the kernel's copies) does not
    h200 = 141 * 10**9
    assert bench.estimate_bytes(relu, relu.benchmark[0], "float32", "forward", 1) < 0.8 * h200
    assert bench.estimate_bytes(relu, relu.benchmark[0], "float32", "backward", 1) > 0.8 * h200
    # the verifier's timed phase (6 checked sets) fits at the decode sizes only
    fit, dropped = bench.verification_shapes(relu, h200)
    assert dropped == [{"N": 8192, "D": 262144}] and fit == [{"N": 8, "D": 4096}, {"N": 1, "D": 4096}]
    assert bench.verification_shapes(relu, 0) == (list(map(dict, relu.benchmark)), [])  # unknown GPU: keep all


def test_bench_rows_survive_failures_and_budget(monkeypatch):
    """bench_spec faked: a row that raises is an error row, the others are timed; past the
    deadline the rest are 'not reached'."""
    import time

    import specgen.bench as sb
    from specgen.spec import load_spec

    spec = load_spec(DEV / "relu.yaml")

    class FakeRow:
        def __init__(self, dims, dtype, direction):
            self.dims, self.dtype, self.direction = dims, dtype, direction
            self.bytes, self.kernel_us, self.eager_us, self.compile_us = 1000, 1.0, 1.0, 1.0
            self.compile_seconds, self.compile_fallback, self.notes, self.rejected, self.floor_us = 1.0, None, [], None, 0.1
            self.eager_graph_us = self.compile_graph_us = 1.0 if direction == "backward" else None  # as BenchRow

        def as_dict(self):
            return {"kernel_roofline_fraction": 0.9}

    calls = []

    def fake_bench_spec(spec, library, *, shapes, dtypes, directions, on_row, **kw):
        calls.append((tuple(shapes[0].items()), tuple(dtypes), directions))
        for dims in shapes:
            for dtype in dtypes:
                for d in directions:
                    if dtype == "bfloat16" and d == "backward":
                        raise RuntimeError("CUDA out of memory (fake)")
                    on_row(FakeRow(dims, dtype, d))

    monkeypatch.setattr(sb, "bench_spec", fake_bench_spec)
    args = bench.parse_args([])
    plan = bench.row_plan(spec, [dict(d) for d in spec.benchmark[1:]], ["float32", "bfloat16"], ["forward", "backward"])
    rows = bench.bench_rows(spec, "lib.so", plan, "pointwise", args, time.time() + 60, 141 * 10**9)
    status = {(bench.shape_text(r["dims"]), r["dtype"], r["direction"]): r["status"] for r in rows}
    assert len(rows) == len(plan) == 8
    assert status[("N=8,D=4096", "bfloat16", "backward")] == "error"
    assert status[("N=8,D=4096", "bfloat16", "forward")] == "timed"
    assert sum(s == "timed" for s in status.values()) == 6
    rows = bench.bench_rows(spec, "lib.so", plan, "pointwise", args, time.time() - 1, 141 * 10**9)
    assert {r["status"] for r in rows} == {"not reached"}


def test_main_with_a_fake_gpu_never_aborts(tmp_path, monkeypatch, capsys):
    """The whole run on fakes (GPU probes, generation and timing): a refusal, a failed
    verification and a crash are rows; the JSON and the table are written."""
    import json
    import types

    import torch

    import specgen.bench as sb
    from specgen.errors import Rejected
    from specgen.spec import load_spec

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: types.SimpleNamespace(total_memory=141 * 10**9))
    monkeypatch.setattr(bench, "environment", lambda dtypes: {"gpu": "fake H200", "neg_gbs": NEG, "hbm_peak_gbs": 4800.0,
                                                              "copy_gbs": 3900.0, "commit": "test"})

    verified_at, timed_at = {}, {}

    def fake_generate(spec, args, timing_spec=None):
        verified_at[spec.name] = list(spec.benchmark)
        timed_at[spec.name] = None if timing_spec is None else list(timing_spec.benchmark)
        assert spec.path.is_file()  # the verifier's worker reloads the spec from its path
        assert load_spec(spec.path).benchmark == spec.benchmark and spec.hash() != load_spec(DEV / spec.path.name).hash() \
            or spec.path.parent == DEV
        if spec.name == "sigmoid":
            raise RuntimeError("the generator crashed (fake)")
        if spec.name == "tanh":
            raise Rejected("no builtin kernel variant passed verification (fake)")
        return {"verified": True, "variant": "default"}, "lib.so"

    def fake_bench_spec(spec, library, *, shapes, dtypes, directions, on_row, **kw):
        for dims in shapes:
            for dtype in dtypes:
                for d in directions:
                    big = max(bench.tensor_sizes(spec, dims, dtype))
                    us = 2 * big / 3950e9 * 1e6  # 3950 GB/s: over 98% of the fake neg() bandwidth
                    r = types.SimpleNamespace(dims=dims, dtype=dtype, direction=d, bytes=2 * big, kernel_us=us,
                                              eager_us=us, compile_us=1.1 * us,
                                              compile_seconds=1.0, compile_fallback=None, notes=[], rejected=None,
                                              floor_us=0.1, as_dict=lambda: {},
                                              eager_graph_us=us if d == "backward" else None,
                                              compile_graph_us=1.1 * us if d == "backward" else None)
                    on_row(r)

    import specgen.agents.builtin as builtin
    from specgen.agents.base import AgentRefused

    real_build = builtin.build_source

    def fake_build(spec, *a, **kw):  # every development spec lowers now: one refused (fake)
        if spec.name == "instance_norm":
            raise AgentRefused(f"{spec.path}: refused (fake); use an LLM agent (--agent openai)")
        return real_build(spec, *a, **kw)

    monkeypatch.setattr(builtin, "build_source", fake_build)
    monkeypatch.setattr(bench, "generate", fake_generate)
    monkeypatch.setattr(sb, "bench_spec", fake_bench_spec)
    code = bench.main(["--only", "relu,instance_norm,sigmoid,tanh", "--out", str(tmp_path), "--tune", "off"])
    assert code == 0
    report = json.loads((tmp_path / "level1_bench.json").read_text())
    status = {p["name"]: p["status"] for p in report["problems"]}
    assert status == {"relu": "verified", "instance_norm": "refused", "sigmoid": "error", "tanh": "not verified"}
    relu_rows = [r for r in report["rows"] if r["name"] == "relu"]
    assert len(relu_rows) == 12  # 3 shapes x 2 dtypes x 2 directions
    skipped = [r for r in relu_rows if r["status"] == "skipped"]
    assert [(r["dtype"], r["direction"]) for r in skipped] == [("float32", "backward")]  # 8.6 GB: too large
    assert "GB" in skipped[0]["message"]
    relu_rows = [r for r in relu_rows if r["status"] != "skipped"]
    assert all(r["status"] == "timed" for r in relu_rows)
    # verified at the shapes the verifier's timed phase fits in; the large rows say so
    assert verified_at["relu"] == [{"N": 8, "D": 4096}, {"N": 1, "D": 4096}]
    relu_problem = next(p for p in report["problems"] if p["name"] == "relu")
    assert relu_problem["verify_dropped_shapes"] == [{"N": 8192, "D": 262144}]
    big = [r for r in relu_rows if r["largest_bytes"] >= 1e9]
    assert all(r["verified_shape"] is False for r in big)
    assert big and all(r["meets"]["bandwidth"] is True for r in big)
    assert all(r["misses"] == [] for r in relu_rows)
    assert report["summary"]["lowered"] == 3 and report["summary"]["refused"] == 1
    assert "targets" in capsys.readouterr().out
    assert timed_at["relu"] is None  # --tune off: nothing is tuned, so the dropped shape is not timed twice
    # --tune on, --tune-shapes all (the default, as `specgen generate`): the tuner times the dropped
    # shape too (--sizes large: a copy of the spec with the run's shapes); with --sizes decode the run
    # has no dropped shape, and the verified spec is timed
    for sizes, timed in (("all", [{"N": 8192, "D": 262144}, {"N": 8, "D": 4096}, {"N": 1, "D": 4096}]),
                         ("large", [{"N": 8192, "D": 262144}]), ("decode", None)):
        assert bench.main(["--only", "relu", "--out", str(tmp_path / sizes), "--tune", "on", "--sizes", sizes]) == 0
        assert timed_at["relu"] == timed, sizes


def test_plan_runs_on_the_cpu(capsys):
    assert bench.main(["--plan", "--only", "relu,instance_norm"]) == 0
    out = capsys.readouterr().out
    # instance_norm lowers too (axis_views.py): its 2 shapes x 2 dtypes x 2 directions are rows
    assert "2 of 2 lowered; 20 rows to time" in out and "146 GB" in out  # relu's float32 backward at 8.6 GB


def test_the_benchmark_explains_its_options():
    """`--help` renders (a bare % in a help string broke argparse's formatting)."""
    import subprocess

    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "level1_bench.py"), "--help"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--verify-shapes" in done.stdout and "80% of the GPU" in done.stdout.replace("\n", " ").replace("  ", " ")


def test_a_shard_goes_on_without_the_problems_an_earlier_call_reached(tmp_path):
    import json

    earlier = {"specs_folder": "dev", "environment": {}, "rows": [], "problems": [
        {"name": "relu", "status": "verified", "path": str(DEV / "relu.yaml")},
        {"name": "cumsum", "status": "refused"}, {"name": "tanh", "status": "not reached"},
        {"name": "sigmoid", "status": "error"},  # run again: a poisoned context makes errors
        {"name": "gelu", "status": "verified", "path": str(tmp_path / "other_set" / "gelu.yaml")}]}
    (tmp_path / "earlier.json").write_text(json.dumps(earlier))
    done = bench.reached_names([str(tmp_path / "earlier.json")])
    # refused counts as reached (nothing left to run); a path names its own set's spec only
    assert done == {str((DEV / "relu.yaml").resolve()), "cumsum", str((tmp_path / "other_set" / "gelu.yaml").resolve())}
    everything = bench.find_specs([DEV])
    rest = bench.find_specs([DEV], skip=done)
    assert {p.stem for p in everything} - {p.stem for p in rest} == {"relu", "cumsum"}
    assert any(p.stem == "tanh" for p in rest)
    # a shard keeps its members: the skipped ones are taken out after the shard is cut
    shard = bench.find_specs([DEV], shard=(1, 3))
    assert bench.find_specs([DEV], shard=(1, 3), skip=done) == [
        p for p in shard if p.stem not in done and str(p.resolve()) not in done]  # names and paths alike
    args = bench.parse_args(["--skip-reached", str(tmp_path / "earlier.json"), "--shard", "1/2"])
    assert args.skip_reached == [str(tmp_path / "earlier.json")]


def test_the_suite_gives_the_tuner_the_users_budget(monkeypatch):
    """The suite's generation is `specgen generate`'s path: its tuner gets that command's budget
    per spec (tune.DEFAULT_BUDGET_S) or --tune-budget, and no budget when it does not tune
    (session 25's review: the harness tuned without a budget)."""
    import types

    import specgen.agents.builtin as builtin
    from specgen.agents.builtin.tune import DEFAULT_BUDGET_S
    from specgen.spec import load_spec

    seen = []

    def fake_generate_builtin(spec, **kwargs):
        seen.append(kwargs)
        return types.SimpleNamespace(variant="default", notes=[], verdicts={}, timings={}, library=None)

    import inspect

    fake_generate_builtin.__signature__ = inspect.signature(builtin.generate_builtin)  # the real parameters
    monkeypatch.setattr(builtin, "generate_builtin", fake_generate_builtin)
    spec = load_spec(DEV / "relu.yaml")
    for tune_on, budget in ((True, None), (True, 30.0), (False, 30.0)):
        bench.generate(spec, types.SimpleNamespace(tune_on=tune_on, tune_budget=budget, examples=None))
    assert [k.get("tune_budget_s") for k in seen] == [DEFAULT_BUDGET_S, 30.0, None]
    assert [k["tune"] for k in seen] == [True, True, False]


def test_the_suite_takes_a_positive_tune_budget_only(capsys):
    for bad in ("0", "-5"):
        with pytest.raises(SystemExit):
            bench.main(["--plan", "--only", "relu", "--tune-budget", bad])
        assert f"{bad} must be" in capsys.readouterr().err  # specgen generate's own check (commands.positive)


def test_training_steps_pair_each_backward_with_its_forward(tmp_path):
    """A baseline whose backward reads what its forward saved (torch.compile's hinge mask) wins the
    backward row alone; the step (forward recording the graph + backward) is what a user pays."""
    fwd = {**row(kernel=100.0, eager=300.0, compile_=90.0), "dims": {"N": 8}}
    bwd = {**row(kernel=120.0, eager=200.0, compile_=40.0), "direction": "backward", "dims": {"N": 8},
           "eager_graph_us": 320.0, "compile_graph_us": 160.0}
    other = {**row(kernel=50.0), "direction": "backward", "dims": {"N": 9}, "compile_graph_us": 10.0}
    bench.training_steps([fwd, bwd, other])
    assert bwd["step_kernel_us"] == pytest.approx(220.0) and bwd["step_compile_us"] == pytest.approx(200.0)
    assert bwd["x_compile_step"] == pytest.approx(200.0 / 220.0) and bwd["x_eager_step"] == pytest.approx(520.0 / 220.0)
    assert "step_kernel_us" not in other and "step_kernel_us" not in fwd  # no forward of its shape; forwards stay
    no_graph = {**row(kernel=120.0), "direction": "backward", "dims": {"N": 8}}
    bench.training_steps([fwd, no_graph])
    assert no_graph["step_compile_us"] is None and no_graph["x_compile_step"] is None
    problems = [{"name": "op", "family": "pointwise", "status": "verified", "lowered": True, "verified": True}]
    rows = [bench.evaluate_row(r, NEG, 4800.0) for r in (fwd, bwd)]
    report = {"specs_folder": "x", "environment": {"gpu": "fake", "neg_gbs": NEG}, "problems": problems, "rows": rows,
              "summary": bench.summarize(problems, rows)}
    bench.write_report(tmp_path, report)
    text = (tmp_path / "level1_bench.md").read_text()
    assert "training steps" in text and "| op | N=8 | float32 | 220.0 | 520.0 | 200.0 | 2.36 | 0.91 |" in text
