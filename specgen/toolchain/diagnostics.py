"""nvcc's, ptxas's and the linker's output turned into short diagnostics (file:line: message)."""
from __future__ import annotations

import re
from dataclasses import dataclass


MAX_SHOWN_DIAGNOSTICS = 20
MAX_MESSAGE_CHARS = 300


@dataclass
class Diagnostic:
    line: int | None
    column: int | None
    severity: str  # "error" | "warning" | "note"
    message: str
    file: str | None
    source_line: str | None = None  # the offending source line, as nvcc echoed it

    def __str__(self) -> str:
        where = ""
        if self.file:
            where = f"{self.file}:{self.line}: " if self.line is not None else f"{self.file}: "
        return f"{where}{self.severity}: {self.message}"


# EDG front end (cudafe++): `kernel.cu(12): error #20: identifier "foo" is undefined`
_EDG = re.compile(r"^(?P<file>\S.*?)\((?P<line>\d+)\): (?P<sev>catastrophic error|internal error|error|warning|"
                  r"remark)(?: #[\w-]+)?: (?P<msg>.*)$")
# gcc / clang (host code, the preprocessor): `kernel.cu:1:10: fatal error: x.h: No such file`
_GCC = re.compile(r"^(?P<file>[^\s:][^:]*):(?P<line>\d+):(?:(?P<col>\d+):)? (?P<sev>fatal error|error|warning|"
                  r"note): (?P<msg>.*)$")
# ptxas / nvlink / nvcc itself: `ptxas error   : Entry function '_Z3bigPf' uses too much shared data`
_TOOL = re.compile(r"^(?P<tool>ptxas|nvlink|nvcc|fatbinary)\s+(?P<sev>fatal|error|warning)\s*: (?P<msg>.*)$")
_UNDEFINED_REFERENCE = re.compile(r"undefined reference to [`'](?P<symbol>[^'`]+)'")
_LINKER = re.compile(r"^(?:\S*/)?(?:ld|ld\.\w+|collect2)(?::| error:) (?P<msg>.*)$")
_SEVERITY = {"catastrophic error": "error", "internal error": "error", "fatal error": "error", "fatal": "error",
             "error": "error", "warning": "warning", "remark": "note", "note": "note"}


def parse_diagnostics(log: str) -> list[Diagnostic]:
    """Diagnostics from nvcc's combined output, in the order printed; duplicates dropped."""
    lines = log.splitlines()
    found: list[Diagnostic] = []
    for index, text in enumerate(lines):
        diagnostic = _parse_line(text, lines[index + 1:index + 4])
        if diagnostic and not any(_same(diagnostic, seen) for seen in found):
            found.append(diagnostic)
    return found


def _same(a: Diagnostic, b: Diagnostic) -> bool:
    return (a.file, a.line, a.severity, a.message) == (b.file, b.line, b.severity, b.message)


def _parse_line(text: str, following: list[str]) -> Diagnostic | None:
    if match := _EDG.match(text):
        source_line, column = _edg_context(following)
        return Diagnostic(int(match["line"]), column, _SEVERITY[match["sev"]], match["msg"].strip(),
                          match["file"], source_line)
    if match := _GCC.match(text):
        column = int(match["col"]) if match["col"] else None
        source_line = None
        if following and (gcc_echo := re.match(r"^\s*\d+\s\|\s?(.*)$", following[0])):
            source_line = gcc_echo.group(1).rstrip()
        return Diagnostic(int(match["line"]), column, _SEVERITY[match["sev"]], match["msg"].strip(),
                          match["file"], source_line)
    if match := _TOOL.match(text):
        return Diagnostic(None, None, _SEVERITY[match["sev"]], f"{match['tool']}: {match['msg'].strip()}", None)
    if match := _UNDEFINED_REFERENCE.search(text):
        return Diagnostic(None, None, "error", f"undefined reference to `{match['symbol']}' (link error)", None)
    if (match := _LINKER.match(text)) and not re.search(r"in function|ld returned", match["msg"]):
        return Diagnostic(None, None, "error", f"linker: {match['msg'].strip()}", None)
    return None


def _edg_context(following: list[str]) -> tuple[str | None, int | None]:
    """EDG echoes the source line indented by two spaces, then a caret under the column."""
    if len(following) < 2 or not following[0].startswith("  "):
        return None, None
    caret = following[1]
    if caret.strip() != "^":
        return following[0][2:].rstrip() or None, None
    return following[0][2:].rstrip() or None, caret.index("^") - 2 + 1


def format_diagnostics(summary: str, diagnostics: list[Diagnostic], log: str = "") -> str:
    """A summary line, then the first errors (then warnings), each trimmed; the log tail if none parsed."""
    errors = [d for d in diagnostics if d.severity == "error"]
    shown = (errors + [d for d in diagnostics if d.severity != "error"])[:MAX_SHOWN_DIAGNOSTICS]
    lines = [summary]
    for diagnostic in shown:
        lines.append(_trim(str(diagnostic)))
        if diagnostic.severity == "error" and diagnostic.source_line:
            lines.append("    " + _trim(diagnostic.source_line.strip()))
    if len(diagnostics) > len(shown):
        lines.append(f"... and {len(diagnostics) - len(shown)} more")
    if not diagnostics and log.strip():
        lines += [_trim(line) for line in log.strip().splitlines()[-MAX_SHOWN_DIAGNOSTICS:]]
    return "\n".join(lines)


def _trim(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE_CHARS else text[:MAX_MESSAGE_CHARS - 3] + "..."
