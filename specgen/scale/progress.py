"""Progress of a scaled build: which spec, which candidate or variant, which GPU, how long.

Off a terminal (CI logs, pipes): one plain line per event, `[  12.3s] gpu1 rmsnorm: ...`,
the task's own lines (attempts, tuned variants) prefixed with its GPU and spec. On a
terminal: the same lines, under a live table of what each GPU runs now and for how long.
"""
from __future__ import annotations

import threading
import time

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from ..ui import elapsed


class BuildProgress:
    def __init__(self, console: Console, executor, total: int, *, live: bool | None = None):
        self.console, self.total = console, total
        self.live_on = console.is_terminal if live is None else live
        self.running: dict[str, tuple[str, float, str]] = {}  # label -> (slot, started, last line)
        self.done = 0
        self.slots = list(getattr(executor, "slots", []) or [])
        self._lock = threading.Lock()
        self._live: Live | None = None
        executor.on_event(self.event)

    def __enter__(self) -> "BuildProgress":
        if self.live_on:
            self._live = Live(self._table(), console=self.console, refresh_per_second=2, transient=True,
                              get_renderable=self._table)
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None

    def _table(self) -> Table:
        table = Table(title=f"specgen: {self.done}/{self.total} specs done", title_justify="left", box=None)
        for column in ("GPU", "spec", "for", "now"):
            table.add_column(column, overflow="ellipsis", no_wrap=True)
        with self._lock:
            rows = sorted(self.running.items(), key=lambda item: item[1][0])
        for label, (slot, started, last) in rows:
            table.add_row(escape(slot), escape(label), f"{time.monotonic() - started:.0f} s", escape(last[:100]))
        return table

    def line(self, text: str, style: str = "") -> None:
        body = escape(text)
        if style:
            body = f"[{style}]{body}[/]"
        self.console.print(f"[dim]\\[{elapsed():8.1f}s][/] {body}", soft_wrap=True, highlight=False)

    def event(self, event: dict) -> None:
        kind, label, slot = event.get("type"), event.get("label", ""), event.get("slot", "")
        with self._lock:
            if kind == "start":
                self.running[label] = (slot, time.monotonic(), "starting")
            elif kind == "log" and label in self.running:
                s, started, _ = self.running[label]
                self.running[label] = (s, started, event.get("text", ""))
            elif kind in ("done", "failed"):
                self.running.pop(label, None)
        if kind == "start":
            again = f" (attempt {event['attempt']})" if event.get("attempt", 1) > 1 else ""
            self.line(f"{slot} {label}: started{again}")
        elif kind == "log":
            self.line(f"{slot} {label}: {event.get('text', '').strip()}")
        elif kind == "retry":
            self.line(f"{slot} {label}: worker lost ({event.get('text', '')}); retrying once on a fresh worker",
                      "yellow")
        elif kind == "failed":
            self.line(f"{slot} {label}: worker lost again ({event.get('text', '')}): reported", "red")

    def finished(self, label: str, slot: str, seconds: float, summary: str) -> None:
        with self._lock:
            self.done += 1
            done = self.done
        self.line(f"{slot} {label}: {summary} in {seconds:.1f} s ({done}/{self.total})")
