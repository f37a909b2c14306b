"""`specgen generate` and `specgen build` share one set of agent/loop options."""
from __future__ import annotations

import pytest

from specgen.cli import build_parser


def _subparser(name: str):
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command")
    return subparsers.choices[name]


def _agent_options(name: str) -> dict:
    group = next(g for g in _subparser(name)._action_groups if g.title == "agent and loop")
    return {a.dest: (a.default, a.type, a.option_strings) for a in group._group_actions}


def test_build_and_generate_take_the_same_agent_options():
    generate, build = _agent_options("generate"), _agent_options("build")
    assert generate == build
    assert {"agent", "model", "base_url", "attempts", "samples", "target_roofline", "arch"} <= set(build)


@pytest.mark.parametrize("command", ["generate", "build"])
def test_attempts_must_be_positive_in_both(command):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([command, "specs", "--attempts", "0"])
    assert exit_info.value.code == 2


@pytest.mark.parametrize("command", ["generate", "build"])
def test_sanitize_asks_the_verifier_for_compute_sanitizer(command):
    from specgen.commands.generate import verify_options

    parser = build_parser()
    assert verify_options(parser.parse_args([command, "specs", "--sanitize"])) == {"sanitize": True}
    assert verify_options(parser.parse_args([command, "specs"])) == {}


def test_the_evaluator_passes_sanitize_to_the_verifier_and_records_it(monkeypatch, tmp_path):
    import specgen.verify as verify
    from specgen import abi, lock
    from specgen.agents.base import Candidate, KernelTask
    from specgen.agents.evaluate import KernelEvaluator
    from specgen.spec import load_spec

    from conftest import SPECS

    calls = []

    class Passed:
        passed, reason, counterexample, cases, timings, tolerances = True, "passed", None, 3, {}, {}

        def to_json(self):
            return {"passed": True, "reason": "passed"}

        def summary(self):
            return "passed"

    monkeypatch.setattr(verify, "verify_kernel", lambda spec, source, **kw: calls.append(kw) or Passed())
    monkeypatch.setattr(lock, "gpu_available", lambda: True)
    spec = load_spec(SPECS / "gelu_tanh.yaml")
    task = KernelTask(spec=spec, header=abi.header_text(spec), header_name=abi.header_filename(spec))
    evaluator = KernelEvaluator(task, arch="sm_90", verify_options={"sanitize": True})
    candidate = Candidate("// source", "test")
    verdict = evaluator.verify(candidate, tmp_path / "lib.so")
    assert calls == [{"arch": "sm_90", "sanitize": True}] and verdict.passed
    (record,) = evaluator.lock_records(candidate, {"verdict_record": verdict.record, "timings": {}})
    assert record.verification["sanitized"] is True
