"""Terminal and CI output shared by the commands: consoles, stage progress, `--json -`.

- On a terminal, rich renders as usual (spinners, the terminal's width).
- Elsewhere (CI logs, pipes) tables get a wide page so no op name is cut, and each stage
  prints a line with the time elapsed since the command started: `[   12.3s] verifying ...`.
- `--json -` writes the machine-readable result on stdout, alone; the human output then goes
  to stderr, so `specgen check specs/ --json - | jq` works.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from typing import Iterator

from rich.console import Console
from rich.markup import escape

PAGE_WIDTH = 200  # columns of a table printed where there is no terminal
QUIET_S = 5.0  # a stage's own progress messages: at most one line per this many seconds off a terminal
_STARTED = time.monotonic()


def is_terminal(stream=None) -> bool:
    stream = stream or sys.stdout
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def console(*, stderr: bool = False) -> Console:
    """A Console that never cuts a table to 80 columns when it is not on a terminal."""
    stream = sys.stderr if stderr else sys.stdout
    width = None
    if not is_terminal(stream):  # a log: as wide as asked, but never narrower than a page
        width = max(int(os.environ.get("COLUMNS") or 0), PAGE_WIDTH)
    return Console(stderr=stderr, highlight=False, width=width, soft_wrap=False)


def human_console(json_target: str | None) -> Console:
    """Where the human output goes: stderr when stdout carries the JSON."""
    return console(stderr=json_target == "-")


def emit_json(target: str | None, data) -> None:
    """Write `data` as JSON to `target` (a file, or '-' for stdout); nothing when None."""
    if not target:
        return
    text = json.dumps(data, indent=2, sort_keys=False, default=str) + "\n"
    if target == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    from .fsutil import write_atomic

    write_atomic(target, text)


def elapsed() -> float:
    return time.monotonic() - _STARTED


def restart_clock() -> None:
    """The command starts now (cli.main calls this; tests run several commands in one process)."""
    global _STARTED
    _STARTED = time.monotonic()


class Stage:
    def __init__(self, progress: "Progress", text: str, status=None):
        self.progress, self.text, self.status = progress, text, status
        self._last = time.monotonic()

    def update(self, message: str) -> None:
        if self.status is not None:
            self.status.update(escape(f"{self.text}: {message}"))
        elif time.monotonic() - self._last >= QUIET_S:
            self._last = time.monotonic()
            self.progress.line(f"{self.text}: {message}")


class Progress:
    """Stage lines on stderr: a spinner on a terminal, a timed line per stage elsewhere."""

    def __init__(self, err: Console | None = None, *, live: bool | None = None):
        self.console = err or console(stderr=True)
        self.live = is_terminal(sys.stdout) and self.console.is_terminal if live is None else live

    def line(self, text: str) -> None:
        if not self.live:
            self.console.print(f"[dim]\\[{elapsed():8.1f}s][/] {escape(text)}", soft_wrap=True)

    @contextlib.contextmanager
    def stage(self, text: str, *, done: bool = True) -> Iterator[Stage]:
        started = time.monotonic()
        if self.live:
            with self.console.status(escape(text) + " ...") as status:
                yield Stage(self, text, status)
        else:
            self.line(f"{text} ...")
            yield Stage(self, text)
        if done:
            self.console.print(f"[green]✓[/] {escape(text)} [dim]({time.monotonic() - started:.1f} s)[/]",
                               soft_wrap=True)


def add_name_column(table, header: str, names, out: Console) -> None:
    """An op-name column that never cuts a name: whole on one line in a log (other columns
    fold around it), folded over lines on a terminal narrower than the name."""
    longest = max((len(n) for n in names), default=len(header))
    if out.is_terminal:
        table.add_column(header, overflow="fold", min_width=min(longest, 30))
    else:
        table.add_column(header, no_wrap=True, min_width=longest)
