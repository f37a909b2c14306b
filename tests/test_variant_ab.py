"""benchmarks/variant_ab.py's table: each B against A timed in the same call (no GPU needed)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import variant_ab  # noqa: E402


def _row(a_us: dict, b_us: dict) -> dict:
    return {"op": "softmax", "direction": "forward", "dims": {"N": 4, "D": 8}, "dtype": "float32",
            "bytes": 4_000_000, "copy_gbs": 4000.0, "a_us": a_us, "b_us": b_us}


def test_each_b_is_compared_with_a_from_its_own_call():
    rows = [_row({"x": 10.0, "y": 20.0}, {"x": 5.0, "y": 30.0})]
    text = variant_ab.table(rows, "a", ["x", "y"])
    line = next(l for l in text.splitlines() if l.startswith("| softmax"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[5] == "20.0"  # A's median over its two calls
    assert cells[7:10] == ["5.0", "0.500", "20%"]  # x: 5 us vs A's 10 us beside it; 1 us floor / 5 us
    assert cells[10:13] == ["30.0", "1.500", "3%"]
    assert "geometric mean of x/a time: 0.500 over 1 rows" in text
    assert "geometric mean of y/a time: 1.500 over 1 rows" in text


def test_a_b_missing_in_a_row_is_shown_and_left_out_of_the_mean():
    rows = [_row({"x": 10.0}, {"x": 12.0}), _row({"x": 10.0, "y": 10.0}, {"x": 12.0, "y": 9.0})]
    text = variant_ab.table(rows, "a", ["x", "y"])
    assert "| - | - | - |" in text
    assert "geometric mean of y/a time: 0.900 over 1 rows" in text
    assert "geometric mean of x/a time: 1.200 over 2 rows" in text


def test_builtin_bench_tunes_per_op_variant_lists():
    import builtin_bench
    import pytest

    every = builtin_bench.variants_per_op("default,cl256")
    assert [v.name for v in every("softmax")] == ["default", "cl256"] == [v.name for v in every("rope")]
    assert builtin_bench.variants_per_op("")("softmax") is None  # all variants
    per_op = builtin_bench.variants_per_op("softmax=default,cl256; rmsnorm=default,csmem")
    assert [v.name for v in per_op("rmsnorm")] == ["default", "csmem"]
    assert [v.name for v in per_op("rope")] == ["default"]  # not named: not tuned
    recorded = builtin_bench.variants_per_op("softmax=medium:cl256+split:default+wide:cl256")("softmax")
    assert [(v.name, v.block_max, v.split_block, v.loop_tpr) for v in recorded] == [
        ("medium:cl256+split:default+wide:cl256", 256, 512, 512)]  # the lock's combination, rebuilt
    # `recorded`: each op's variant as the lock has it (the same one the golden test rebuilds)
    from specgen.agents.builtin.tune import recorded_variant
    from specgen.lock import Lock

    lock = Lock.load(builtin_bench.REPO / "specs")
    by_lock = builtin_bench.variants_per_op("recorded")
    for op in ("softmax", "cross_entropy", "rmsnorm", "gelu_tanh"):
        assert [v.name for v in by_lock(op)] == [recorded_variant(lock.entry(op))]
    assert [v.name for v in by_lock("softmax")] == ["few:fewtwo+medium:cl256two+split:default+wide:cl256"]
    with pytest.raises(ValueError, match="no variant nope"):
        builtin_bench.variants_per_op("softmax=default,nope")
    with pytest.raises(ValueError, match="op=variant"):
        builtin_bench.variants_per_op("=default")


def test_compile_all_compiles_every_source_and_raises_a_compile_error(monkeypatch):
    from types import SimpleNamespace

    import pytest

    from specgen.agents.builtin import generator

    def fake_compile(spec, source, **_):
        if "broken" in source:
            raise RuntimeError(f"nvcc failed on {spec}")
        return SimpleNamespace(library=f"lib-{source}")

    monkeypatch.setattr(generator, "compile_source", fake_compile)
    sources = {("softmax", "default"): ("softmax", "a"), ("softmax", "cl256"): ("softmax", "b")}
    assert variant_ab.compile_all(sources) == {("softmax", "default"): "lib-a", ("softmax", "cl256"): "lib-b"}
    results = generator.compile_many([("rope", "broken"), ("rope", "c")])
    assert isinstance(results[0], RuntimeError) and results[1].library == "lib-c"  # one error stops no other
    with pytest.raises(RuntimeError, match="nvcc failed on rope"):
        variant_ab.compile_all({("rope", "default"): ("rope", "broken")})


def test_committed_and_recorded_name_the_lock_kernel_and_the_generator_source_now():
    from specgen.agents.builtin import build_source
    from specgen.spec import load_spec

    committed, recorded, wave = variant_ab.named("committed,recorded,wave")
    assert (committed.name, recorded.name, wave.name) == ("committed", "recorded", "wave")
    spec = load_spec(variant_ab.REPO / "specs" / "softmax.yaml")
    assert variant_ab.source_of(spec, committed) == (variant_ab.REPO / "specs" / "kernels" / "softmax.cu").read_text()
    assert variant_ab.recorded_variant(spec).name == "few:fewtwo+medium:cl256two+split:default+wide:cl256"
    assert variant_ab.source_of(spec, recorded) == build_source(spec, variant_ab.recorded_variant(spec))
    import pytest
    with pytest.raises(ValueError, match="no variant nope"):
        variant_ab.named("committed,nope")


def test_decode_ab_shapes_put_the_rows_first_and_the_hidden_size_last():
    import decode_ab
    from specgen.spec import load_spec

    specs = Path(__file__).resolve().parent.parent / "specs"
    assert decode_ab.decode_dims(load_spec(specs / "swiglu.yaml"), 8, 4096) == {"N": 8, "H": 4096}  # x: [8, 8192]
    assert decode_ab.decode_dims(load_spec(specs / "cross_entropy.yaml"), 1, 4096) == {"N": 1, "C": 4096}
    assert decode_ab.decode_dims(load_spec(specs / "rope.yaml"), 32, 4096) == {"S": 32, "H": 32, "D": 128}


def test_sources_may_name_a_combination_of_variants_per_shape_class():
    found = variant_ab.named("committed,fewblock,few:fewblock+medium:twopass")
    assert [v.name for v in found] == ["committed", "fewblock", "few:fewblock+medium:twopass"]
    combined = found[2]
    assert combined.few_form == "block" and combined.reg_pair == "twopass" and combined.row_block == 128
    with pytest.raises(ValueError, match="no variant nosuch"):
        variant_ab.named("nosuch")


def test_a_source_may_override_fields_of_a_variant_for_an_experiment():
    """`base~field=value`: the base variant with those fields replaced, named by the whole text;
    a field that is not a Variant's, or a value of the wrong kind, is a ValueError naming it."""
    from specgen.agents.builtin.schedule import variant_named

    (got,) = variant_ab.named("regs16~min_threads=2048~few_rows=false~few_form=block")
    base = variant_named("regs16")
    assert got.name == "regs16~min_threads=2048~few_rows=false~few_form=block"
    assert (got.min_threads, got.few_rows, got.few_form) == (2048, False, "block")
    assert (got.data_regs, got.items_cap) == (base.data_regs, base.items_cap) == (16, 4)
    (combined,) = variant_ab.named("few:fewtwo+medium:cl256~data_regs=8")
    assert (combined.data_regs, combined.block_max, combined.few_pair) == (8, 256, "twopass")
    with pytest.raises(ValueError, match="registers"):
        variant_ab.named("default~registers=8")
    with pytest.raises(ValueError, match="true or false"):
        variant_ab.named("default~few_rows=1")
    with pytest.raises(ValueError):
        variant_ab.named("default~data_regs=many")


def test_recorded_takes_overrides_applied_to_each_ops_own_recorded_variant():
    import dataclasses

    from specgen.agents.builtin.generator import build_source
    from specgen.spec import load_spec

    (source,) = variant_ab.named("recorded~reg_pair=twopass")
    assert isinstance(source, variant_ab.Named)
    spec = load_spec(variant_ab.REPO / "specs" / "log_softmax.yaml")
    recorded = variant_ab.recorded_variant(spec)
    want = build_source(spec, dataclasses.replace(recorded, name=source.name, reg_pair="twopass"))
    assert variant_ab.source_of(spec, source) == want != build_source(spec, recorded)
    with pytest.raises(ValueError, match="no fields to override"):
        variant_ab.named("committed~reg_pair=twopass")
    with pytest.raises(ValueError, match="not field=value"):
        variant_ab.named("recorded~nosuch=1")
