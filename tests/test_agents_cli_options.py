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
