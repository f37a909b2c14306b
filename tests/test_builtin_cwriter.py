"""The builtin generator's C writer (agents/builtin/cwriter.py): exact text out."""
from __future__ import annotations

import pytest

from specgen.agents.builtin.cwriter import CWriter


def test_blocks_nest_two_spaces_a_level():
    w = CWriter()
    w.line("static void f(int n)")
    with w.block():
        w.line("int s = 0;")
        with w.block("for (int i = 0; i < n; ++i)"):
            with w.block("if (i % 2)"):
                w.line("s += i;")
        w.line("g(s);")
    assert w.text() == ("static void f(int n)\n"
                        "{\n"
                        "  int s = 0;\n"
                        "  for (int i = 0; i < n; ++i) {\n"
                        "    if (i % 2) {\n"
                        "      s += i;\n"
                        "    }\n"
                        "  }\n"
                        "  g(s);\n"
                        "}")


def test_blank_lines_stay_empty_at_any_level():
    w = CWriter()
    with w.block("if (a)"):
        w.line("x();")
        w.line()
        w.line("")
        w.line("y();")
    assert w.to_lines() == ["if (a) {", "  x();", "", "", "  y();", "}"]


def test_a_trailer_follows_the_closing_brace():
    w = CWriter()
    with w.block("struct P", trailer=";"):
        w.line("int x;")
    with w.block("auto f = [&]()", trailer=";"):
        w.line("return 1;")
    assert w.to_lines() == ["struct P {", "  int x;", "};", "auto f = [&]() {", "  return 1;", "};"]


def test_a_comment_follows_the_opening_brace():
    w = CWriter()
    with w.block("if (warp == 0)", comment="the warp totals"):
        w.line("x();")
    with w.chain("else", comment="the others"):
        w.line("y();")
    assert w.to_lines() == ["if (warp == 0) {  // the warp totals", "  x();", "} else {  // the others", "  y();",
                            "}"]


def test_chain_continues_the_block_just_closed():
    w = CWriter(level=1)
    with w.block("if (a)"):
        w.line("x();")
    with w.chain("else if (b)"):
        w.line("y();")
    with w.chain("else"):
        w.line("z();")
    assert w.text() == ("  if (a) {\n"
                        "    x();\n"
                        "  } else if (b) {\n"
                        "    y();\n"
                        "  } else {\n"
                        "    z();\n"
                        "  }")


def test_chain_needs_a_block_closed_at_its_level():
    w = CWriter()
    w.line("x();")
    with pytest.raises(ValueError):
        with w.chain("else"):
            pass
    with w.block("if (a)"):
        with w.block("if (b)"):
            w.line("y();")
        with pytest.raises(ValueError):  # `}` of the outer block not written yet
            w.line("z();")
            with w.chain("else"):
                pass


def test_preformatted_lines_keep_their_spaces_on_top_of_the_level():
    w = CWriter()
    with w.block("if (a)"):
        w.lines(["x();", "  // continued", ""])
        w.line("const bool ok = p\n    && q;")
    assert w.to_lines() == ["if (a) {", "  x();", "    // continued", "", "  const bool ok = p", "      && q;", "}"]


def test_directives_go_to_column_zero():
    w = CWriter()
    with w.block():
        with w.block("if (a)"):
            w.directive("#if defined(__CUDA_ARCH__)")
            w.line("#pragma unroll")  # a pragma is a statement: it follows the nesting
            w.directive("#endif")
    assert w.to_lines() == ["{", "  if (a) {", "#if defined(__CUDA_ARCH__)", "    #pragma unroll", "#endif",
                            "  }", "}"]


def test_verbatim_lines_keep_their_bytes_whatever_the_level():
    w = CWriter()
    with w.block():
        with w.block("for (;;)"):
            w.verbatim("  const int n = 1;")  # the function body's indentation, inside the loop
            w.line("f(n);")
    assert w.to_lines() == ["{", "  for (;;) {", "  const int n = 1;", "    f(n);", "  }", "}"]


def test_the_starting_level_and_the_bare_block():
    w = CWriter(level=2)
    with w.block():
        w.line("double part = 0;")
    assert w.to_lines() == ["    {", "      double part = 0;", "    }"]
    assert w.level == 2 and w.indent == "    "
