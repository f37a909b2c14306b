"""An indentation-aware writer of C text, so emitters nest blocks instead of counting spaces.

    w = CWriter()
    w.line("template <typename T>")
    w.line("static void f(int n)")
    with w.block():                    # `{` on its own line, as the generated functions have it
        with w.block("if (n > 0)"):    # `if (n > 0) {`
            w.line("g(n);")
        with w.chain("else"):          # the `}` above becomes `} else {`
            w.line("h();")
    w.text()

Indentation is two spaces a level. Lines given with their own leading spaces keep them on
top of the current level; preprocessor lines go to column 0 (`directive`), and a line whose
bytes must stay as they are goes in unchanged (`verbatim`).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterable, Iterator

UNIT = "  "


class CWriter:
    def __init__(self, level: int = 0):
        """`level`: the starting depth, for lines that go into text already nested that deep."""
        self.level = level
        self._out: list[str] = []

    @property
    def indent(self) -> str:
        return UNIT * self.level

    def line(self, text: str = "") -> None:
        """One statement at the current level; each line of a multi-line `text` is indented
        (continuations keep their own extra spaces), an empty line stays empty."""
        for part in text.split("\n"):
            self._out.append(self.indent + part if part else "")

    def lines(self, texts: Iterable[str]) -> None:
        """Pre-formatted lines (a helper's output), each at the current level."""
        for text in texts:
            self.line(text)

    def directive(self, text: str) -> None:
        """A preprocessor line (#define, #if, #endif): column 0 whatever the nesting."""
        self.verbatim(text)

    def verbatim(self, text: str) -> None:
        """A line exactly as given, whatever the nesting: output whose indentation predates the
        writer and must keep its bytes."""
        self._out.append(text)

    @contextmanager
    def block(self, header: str = "", trailer: str = "", comment: str = "") -> Iterator[None]:
        """`header {`, the body one level deeper, then `}` + `trailer` (e.g. ";"). No header:
        `{` alone on its line (a function body after its signature, or a bare scope).
        `comment`: a `// comment` after the opening brace (what the block is for)."""
        opening = f"{header} {{" if header else "{"
        self.line(opening + (f"  // {comment}" if comment else ""))
        self.level += 1
        try:
            yield
        finally:
            self.level -= 1
        self.line("}" + trailer)

    @contextmanager
    def chain(self, header: str, comment: str = "") -> Iterator[None]:
        """A block continuing the one just closed at this level: its `}` becomes `} header {`
        (`else`, `else if (...)`)."""
        if not self._out or self._out[-1] != self.indent + "}":
            raise ValueError(f"chain({header!r}) must follow a block closed at this level")
        self._out.pop()
        with self.block("} " + header, comment=comment):
            yield

    def to_lines(self) -> list[str]:
        return list(self._out)

    def text(self) -> str:
        return "\n".join(self._out)
