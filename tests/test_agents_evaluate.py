"""The real evaluator's adapters to the verifier's Verdict (specgen/agents/evaluate.py)."""
from pathlib import Path

import pytest

from agents_support import FAST, SPEC_YAML, make_task
from specgen import abi
from specgen.agents.base import Candidate, KernelTask
from specgen.agents.evaluate import KernelEvaluator, summarize_benchmark
from specgen.agents.prompts import feedback_text
from specgen.spec import load_spec
from specgen.verify.verdict import PASSED, WRONG_RESULT, Counterexample, Verdict


@pytest.fixture
def evaluator(tmp_path):
    return KernelEvaluator(make_task(tmp_path))


def test_a_failed_verdict_becomes_prompt_feedback(evaluator, monkeypatch):
    wrong = Verdict(WRONG_RESULT, "1 of 4097 elements of 'out' outside tolerance",
                    Counterexample(direction="forward",
                                   case={"dims": {"N": 4097}, "dtype": "float32", "distribution": "normal",
                                         "seed": 3, "offset": 1},
                                   output="out", max_abs_error=0.5, max_rel_error=0.25, index=[4096],
                                   expected=1.0, got=0.5, bad_elements=1, total_elements=4097,
                                   where=["tail: elements 4096.. of 4097"]))
    seen = {}

    def fake_verify_kernel(spec, kernel, **options):
        seen["kernel"] = kernel
        return wrong

    monkeypatch.setattr("specgen.verify.verify_kernel", fake_verify_kernel)
    verdict = evaluator.verify(Candidate(FAST, "openai"), Path("/x.so"))
    assert seen["kernel"] == FAST  # the verifier gets the source
    assert not verdict.passed and verdict.reason.startswith("wrong-result: 1 of 4097")
    example = verdict.counterexample
    assert example["shape"] == "N=4097" and example["dtype"] == "float32" and example["seed"] == 3
    assert example["offset"] == 1 and example["where"] == "tail: elements 4096.. of 4097"
    assert example["max_abs_error"] == 0.5 and example["index"] == (4096,)
    text = feedback_text(2, "verify", False, reason=verdict.reason, counterexample=example,
                         report=verdict.report)
    assert "shape: N=4097" in text and "max_abs_error: 0.5" in text and "tail: elements 4096" in text


def test_a_passing_verdict_keeps_its_record_for_the_lock(evaluator, monkeypatch):
    monkeypatch.setattr("specgen.verify.verify_kernel",
                        lambda spec, kernel, **o: Verdict(PASSED, "40 cases passed", cases=40, log="big log"))
    verdict = evaluator.verify(Candidate(FAST, "openai"), Path("/x.so"))
    assert verdict.passed and verdict.record["passed"] is True and verdict.record["cases"] == 40
    assert "log" not in verdict.record


def test_benchmark_rows_are_summed_and_the_roofline_fraction_is_of_the_totals():
    rows = [{"kernel_us": 100.0, "eager_us": 120.0, "roofline_us": 80.0},
            {"kernel_us": 10.0, "eager_us": 8.0, "roofline_us": 1.0}]
    timings = summarize_benchmark(rows)
    assert timings["kernel_us"] == 110.0 and timings["eager_us"] == 128.0
    assert timings["roofline_fraction"] == pytest.approx(81.0 / 110.0)
    assert "compile_us" not in timings  # absent from the rows: not invented


def test_a_bench_result_becomes_timings(evaluator, monkeypatch):
    from specgen.bench import BenchResult, BenchRow

    rows = [BenchRow("scale_add", {"N": 1 << 20}, "float32", 8 << 20, 2.0, 4000.0, kernel_us=4.0, eager_us=5.0,
                     compile_us=4.5),
            BenchRow("scale_add", {"N": 64}, "float32", 512, 0.1, 4000.0, kernel_us=2.0, eager_us=3.0)]
    seen = {}

    def fake_benchmark_kernel(spec, library, baseline=None):
        seen["library"], seen["baseline"] = library, baseline
        return BenchResult("scale_add", "NVIDIA H200", 4000.0, rows)

    monkeypatch.setattr("specgen.bench.benchmark_kernel", fake_benchmark_kernel)
    timings = evaluator.measure(Candidate(FAST, "openai"), Path("/lib.so"))
    assert seen == {"library": Path("/lib.so"), "baseline": None}
    assert timings["kernel_us"] == 6.0 and timings["eager_us"] == 8.0 and "compile_us" not in timings
    assert timings["roofline_fraction"] == pytest.approx(2.1 / 6.0)
    assert timings["per_shape"][1]["dims"] == {"N": 64}
    assert timings["benchmark"]["rows"][0]["speedup_vs_eager"] == pytest.approx(1.25)
    line = feedback_text(1, "done", True, timings=timings, per_shape=timings["per_shape"], target=0.8)
    assert "kernel 6.00 us; eager PyTorch 8.00 us (kernel 1.33x faster)" in line
    assert "[N=64, float32] kernel 2.00 us" in line


def test_a_spec_without_benchmark_shapes_is_measured_as_not_timed(tmp_path, monkeypatch):
    """`benchmark:` is optional: the loop's measurement says nothing was timed instead of failing
    (an internal error in `specgen build` on the H200, session 13)."""
    path = tmp_path / "scale_add.yaml"
    path.write_text(SPEC_YAML.split("benchmark:")[0])
    spec = load_spec(path)
    assert not spec.benchmark
    task = KernelTask(spec=spec, header=abi.header_text(spec), header_name=abi.header_filename(spec))

    def no_bench(*args, **kwargs):
        raise AssertionError("nothing may be timed without benchmark shapes")

    monkeypatch.setattr("specgen.bench.benchmark_kernel", no_bench)
    timings = KernelEvaluator(task).measure(Candidate(FAST, "openai"), Path("/x.so"))
    assert timings["per_shape"] == [] and "no `benchmark:` shapes" in timings["note"]
    assert summarize_benchmark(timings["per_shape"]).get("kernel_us") is None
