"""The row kernel's layout (agents/builtin/emit.py): written through CWriter, it keeps the bytes
it had before (committed kernels carry them); `unindented` and `pass_level` give most of it, and
verbatim is left for the one thing no nesting gives."""
from __future__ import annotations

from pathlib import Path

from specgen.agents.builtin.cwriter import CWriter
from specgen.agents.builtin.emit import PASS_LEVEL, DirectionEmitter, pass_level, unindented
from specgen.agents.builtin.generator import lower_spec
from specgen.spec import load_spec

SPECS = Path(__file__).resolve().parent.parent / "specs"


def test_unindented_keeps_the_body_at_the_braces_depth_and_chains():
    w = CWriter(level=1)
    with unindented(w, w.block("if (a)", comment="why")):
        w.line("x();")
    with unindented(w, w.chain("else")):
        w.line("y();")
    w.line("z();")
    assert w.to_lines() == ["  if (a) {  // why", "  x();", "  } else {", "  y();", "  }", "  z();"]


def test_pass_level_writes_at_its_depth_and_returns():
    w = CWriter(level=1)
    with pass_level(w):
        w.line("x();")
    w.line("y();")
    assert w.to_lines() == ["  " * PASS_LEVEL + "x();", "  y();"]


def test_only_the_streamed_chunk_loops_are_written_verbatim(monkeypatch):
    """The streamed sweep's chunk loop has its body at its `for`'s depth and its `}` one level left
    of it: the lines the row kernel writes verbatim, and no others."""
    written = []
    original = CWriter.verbatim

    def record(self, text):
        written.append(text)
        original(self, text)

    monkeypatch.setattr(CWriter, "verbatim", record)
    spec = load_spec(SPECS / "softmax.yaml")
    source = DirectionEmitter(spec, lower_spec(spec)["forward"], "forward").emit_row_kernel()
    # softmax forward streams its row twice (the online (max, sum) sweep, then the final pass)
    assert written == ["        for (int u = 0; u < UNROLL; ++u) {", "      }"] * 2
    lines = source.split("\n")
    # each streamed sweep's two chunk loops: the loads' nests its body, the verbatim one does not
    after = [lines[i + 1] for i, line in enumerate(lines) if line == written[0]]
    assert after == ["          const int64_t c = c0 + (int64_t)u * TPR;",
                     "        const int64_t c = c0 + (int64_t)u * TPR;"] * 2
