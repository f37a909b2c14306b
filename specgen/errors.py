"""Error types and the exit code each one maps to (README.md: exit codes)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

EXIT_OK = 0
EXIT_REJECTED = 1  # a kernel or spec was rejected: compile error, failed verification, refused lowering
EXIT_USAGE = 2  # usage or spec error
EXIT_ENVIRONMENT = 3  # nvcc, GPU, API key or SDK missing


class SpecgenError(Exception):
    """Base class: every error a user can see. `exit_code` is what the CLI returns."""

    exit_code = EXIT_USAGE


class UsageError(SpecgenError):
    exit_code = EXIT_USAGE


class EnvironmentMissing(SpecgenError):
    """Something outside specgen is missing: nvcc, a GPU, an SDK, an API key."""

    exit_code = EXIT_ENVIRONMENT


class Rejected(SpecgenError):
    """A kernel or spec was rejected: compile error, failed verification, refused lowering."""

    exit_code = EXIT_REJECTED


@dataclass
class Location:
    path: Path | str
    line: int | None = None  # 1-based
    column: int | None = None  # 1-based

    def __str__(self) -> str:
        text = str(self.path)
        if self.line is not None:
            text += f":{self.line}"
            if self.column is not None:
                text += f":{self.column}"
        return text


class SpecError(SpecgenError):
    """A problem in a spec file, pointing at the file, line, column and field."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, *, location: Location | None = None,
                 field: str | None = None, hint: str | None = None):
        self.message = message
        self.location = location
        self.field = field
        self.hint = hint
        super().__init__(str(self))

    def __str__(self) -> str:
        parts = []
        if self.location is not None:
            parts.append(f"{self.location}: ")
        if self.field:
            parts.append(f"{self.field}: ")
        parts.append(self.message)
        if self.hint:
            parts.append(f"\n  hint: {self.hint}")
        return "".join(parts)
