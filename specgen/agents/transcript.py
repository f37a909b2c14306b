"""The transcript of one generate run: JSONL, one record per line, secrets redacted.

Records: {"type": "start", ...}, one {"type": "attempt", ...} per candidate (prompt
messages, raw answer, source, stage, feedback, diagnostics / verdict / timings, tokens,
cost), then {"type": "end", ...}. `replay` reruns the attempts' sources in order.
API keys never reach the file: every string is scrubbed of the values of key-like
environment variables before it is written.
"""
from __future__ import annotations

import json
import os
import re
import threading
import time
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any, Iterator

from ..errors import UsageError

_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL)", re.I)
REDACTED = "[redacted]"


def secret_values() -> list[str]:
    """Values of environment variables that look like credentials (long enough to matter)."""
    values = {value for name, value in os.environ.items()
              if _SECRET_NAME.search(name) and len(value.strip()) >= 8}
    return sorted(values, key=len, reverse=True)


def _plain(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    return repr(value)


def redact(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    # Bearer tokens and sk-... keys that did not come from the environment.
    text = re.sub(r"(?i)(bearer\s+)[A-Za-z0-9._\-]{12,}", r"\1" + REDACTED, text)
    return re.sub(r"\bsk-[A-Za-z0-9_\-]{16,}", REDACTED, text)


class Transcript:
    """Appends records to a JSONL file; thread-safe (parallel samples write concurrently)."""

    def __init__(self, path: Path | None):
        self.path = Path(path) if path else None
        self._lock = threading.Lock()
        self._secrets = secret_values()
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text("")  # a new run starts a new file

    def write(self, record: dict[str, Any]) -> None:
        if not self.path:
            return
        record = {"time": round(time.time(), 3), **record}
        line = redact(json.dumps(record, default=_plain, ensure_ascii=False), self._secrets)
        with self._lock, open(self.path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
            handle.flush()


def default_path(folder: Path, op: str) -> Path:
    return Path(folder) / f"{op}-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"


def read_records(path: Path) -> Iterator[dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"--transcript {path}: no such file")
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as error:
                raise UsageError(f"{path}:{number}: not a transcript line ({error.msg})") from None
