"""The row-program IR's invariants (agents/builtin/validate.py), checked after the lowering and
after every pass: broken programs are stopped with the pass and the node named; every program
of the example specs and the development suite passes them."""
from __future__ import annotations

from pathlib import Path

import pytest

from specgen.agents.builtin import generator, validate as validation
from specgen.agents.builtin.ir import Node, Program, Store
from specgen.agents.builtin.validate import IRError, run_passes, validate
from specgen.spec import load_spec

REPO = Path(__file__).resolve().parent.parent


def program(*stores: Store) -> Program:
    width = Node("dim", level="global", dtype="int", attrs={"symbol": "D"})
    return Program("op", "forward", [], width, 8, list(stores))


def leaf() -> Node:
    return Node("load", level="elem", name="x", attrs={"field": "x", "kind": "elem"})


def test_a_well_formed_program_passes_unchanged():
    x = leaf()
    row_max = Node("rowreduce", (x,), level="row", attrs={"kind": "max"})
    shifted = Node("sub", (x, row_max), level="elem")
    loss = Node("globalreduce", (Node("neg", (row_max,), level="row"),), level="post")
    good = program(Store("out", shifted, "elem"), Store("loss", loss, "global"))
    assert validate(good, "lowering") is good


@pytest.mark.parametrize("broken, words", [
    (lambda x: Store("out", Node("exp", (x,), level="row"), "elem"), "level row, but its arguments' highest is elem"),
    (lambda x: Store("out", Node("frobnicate", (x,), level="elem"), "elem"), "unknown op 'frobnicate'"),
    (lambda x: Store("out", Node("add", (x,), level="elem"), "elem"), "add takes 2 argument(s), not 1"),
    (lambda x: Store("r", Node("rowreduce", (Node("rowreduce", (x,), level="row", attrs={"kind": "sum"}),),
                               level="row", attrs={"kind": "sum"}), "row"), "rowreduce goes from elem values"),
    (lambda x: Store("r", Node("rowreduce", (x,), level="row", attrs={"kind": "prod"}), "row"), "rowreduce kind"),
    (lambda x: Store("out", Node("globalreduce", (Node("rowreduce", (x,), level="row", attrs={"kind": "sum"}),),
                                 level="post"), "elem"), "a elem store of out from a post value"),
    (lambda x: Store("out", x, "flat"), "store kind 'flat'"),
    (lambda x: Store("r", x, "row"), "a row store of r from a elem value"),
])
def test_a_broken_program_is_stopped_with_the_pass_and_the_node(broken, words):
    with pytest.raises(IRError) as info:
        validate(program(broken(leaf())), "onehot_sums")
    message = str(info.value)
    assert message.startswith("the op forward program after onehot_sums: ")
    if words:
        assert words in message


def test_run_passes_names_the_pass_that_broke_the_program():
    def widen_levels(p: Program) -> Program:  # a pass with a bug: an elem value marked as a row value
        bad = Node("exp", (p.stores[0].value,), level="row")
        return program(Store("out", bad, "elem"))

    good = program(Store("out", Node("exp", (leaf(),), level="elem"), "elem"))
    assert run_passes(good, [lambda p: p]) is good
    with pytest.raises(IRError, match="after widen_levels: level row"):
        run_passes(good, [widen_levels])


def test_every_program_of_the_example_specs_and_the_suite_is_validated_after_each_pass(monkeypatch):
    calls = []
    real = validation.validate
    monkeypatch.setattr(validation, "validate", lambda p, after: calls.append(after) or real(p, after))
    paths = sorted((REPO / "specs").glob("*.yaml")) + sorted((REPO / "benchmarks/level1/specs").glob("*.yaml"))
    lowered = 0
    for path in paths:
        spec = load_spec(path)
        generator._programs.pop(spec.hash(), None)  # not the cached programs: lower again
        try:
            generator.lower_spec(spec)
        except Exception as error:  # noqa: BLE001 - refusals (outside the families) are not our subject
            assert not isinstance(error, IRError), f"{path.name}: {error}"
            continue
        lowered += 1
    assert lowered >= 40
    assert {"lowering", "cse", "onehot_sums", "lone_norms", "shared_logsumexp", "reuse_saved_rows",
            "_with_forward_outputs"} <= set(calls)


def test_the_fused_patterns_are_matched_by_a_pass_and_read_by_the_emitter():
    """optimize.mark_fused_pairs marks softmax's sum of exp(x - max) with its max, LayerNorm's sum
    of squared deviations with its sum and mean; a program without them gets no marks; twice is
    the same as once."""
    from specgen.agents.builtin.optimize import mark_fused_pairs

    def reductions(op: str) -> list:
        program = generator.lower_spec(load_spec(REPO / "specs" / f"{op}.yaml"))["forward"]
        mark_fused_pairs(mark_fused_pairs(program))
        return [n for n in program.nodes() if n.op == "rowreduce"]

    softmax = reductions("softmax")
    maxes = [n for n in softmax if n.attrs["kind"] == "max"]
    paired = [n for n in softmax if "online_max" in n.attrs]
    assert len(maxes) == 1 and len(paired) == 1 and paired[0].attrs["online_max"] == maxes[0].id
    layernorm = reductions("layernorm_gelu")
    squares = [n for n in layernorm if "moments_of" in n.attrs]
    assert len(squares) == 1
    first = next(n for n in layernorm if n.id == squares[0].attrs["moments_of"])
    assert first.attrs["kind"] == "sum" and first is not squares[0]
    assert not any("online_max" in n.attrs or "moments_of" in n.attrs for n in reductions("rmsnorm"))


def test_a_program_that_fails_its_invariants_is_a_refusal_not_a_crash(tmp_path, monkeypatch):
    """A lowering bug that builds an elem store from a total over rows (what session 21's review
    found): the user gets the spec's refusal with the reason, never a kernel."""
    import pytest

    from specgen.agents.base import AgentRefused
    from specgen.agents.builtin import generator
    from specgen.agents.builtin.ir import Node, Program, Store, const
    from specgen.spec import load_spec

    def broken_lowering(traced, *options):  # lower.lower's signature: the traced graph and the retries' flags
        x = Node("load", level="elem", attrs={"field": "x", "kind": "elem", "row_div": []}, name="x")
        total = Node("globalreduce", (Node("rowreduce", (x,), level="row", attrs={"kind": "sum"}),), level="post",
                     attrs={"kind": "sum"})
        return Program(traced.spec.name, traced.direction, [], const(1), 1,
                       [Store("out", Node("mul", (x, total), level="post"), "elem")])

    path = tmp_path / "irerr.yaml"
    path.write_text(
        "name: irerr\n"
        "description: a row value times a total\n"
        'signature: "irerr(x: Tensor[B, H]) -> Tensor[B, H]"\n'
        "dtypes: [float32]\n"
        "dims: {B: [1, 8], H: [1, 64]}\n"
        "reference: |\n"
        "  def reference(x):\n"
        "      return x * 2\n")
    monkeypatch.setattr(generator, "lower", broken_lowering)
    monkeypatch.setattr(generator, "lower_family", lambda spec, refusal, last=False: (_ for _ in ()).throw(refusal))
    with pytest.raises(AgentRefused) as info:
        generator.build_source(load_spec(path))
    assert "irerr.yaml" in str(info.value) and "internal check" in str(info.value)
