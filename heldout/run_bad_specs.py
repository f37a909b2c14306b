"""Held-out bad specs: how `specgen check` answers specs a user got wrong.

    python3 heldout/run_bad_specs.py [--dir heldout/bad_specs-v2] [--json OUT.json]

Each file of the folder (default heldout/bad_specs/, the first suite) is a spec with one mistake (a YAML tab, a typo in a dtype or a
tolerance key, a reference that raises, a shape the signature does not promise, ...), written
from a user's side without reading specgen's error code. Its first line says a word the error
should name (`# expect-mention: WORD`). For each, `specgen check FILE` runs in a fresh process on
a copy, and the row says: rejected (a nonzero exit), no traceback (a message, not a crash), names
the file, mentions the word, and the file left byte for byte as it was. CPU only.
Do not tune specgen's messages on these files: write new ones for the next measurement.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CHECKS = ("rejected", "no_traceback", "names_file", "mentions", "untouched")


def _env() -> dict:
    """This checkout's specgen for the child, installed or not (a fresh clone: every row was
    'No module named specgen', rejected for the wrong reason, session 37)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def _mentions(text: str, word: str, name: str) -> bool:
    """The word, case-insensitively; `line`: a line number after the file's name (FILE:LINE)."""
    if word == "line":
        return re.search(re.escape(name) + r":\d+", text) is not None
    return word.lower() in text.lower()


def run_one(path: Path) -> dict:
    word = path.read_text().splitlines()[0].split("expect-mention:", 1)[1].strip()
    with tempfile.TemporaryDirectory(prefix="bad-spec-") as folder:
        copy = Path(folder) / path.name
        shutil.copy(path, copy)
        before = copy.read_bytes()
        done = subprocess.run([sys.executable, "-m", "specgen.cli", "check", str(copy)], capture_output=True,
                              text=True, timeout=300, cwd=folder, env=_env())
        text = done.stdout + done.stderr
        row = {"file": path.name, "word": word, "exit": done.returncode, "rejected": done.returncode != 0,
               "no_traceback": "Traceback (most recent call last)" not in text, "names_file": path.name in text,
               "mentions": _mentions(text, word, path.name), "untouched": copy.read_bytes() == before,
               "message": text.strip()[-1500:]}
    row["ok"] = all(row[c] for c in CHECKS)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=HERE / "bad_specs", help="the suite's folder")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    files = sorted(args.dir.glob("*.yaml"))
    if not files:
        parser.error(f"--dir {args.dir}: no .yaml files there")
    rows = [run_one(p) for p in files]
    for r in rows:
        marks = " ".join(("+" if r[c] else "-") + c for c in CHECKS)
        print(f"{r['file']:42s} exit {r['exit']:3d}  {marks}")
    summary = {c: sum(r[c] for r in rows) for c in CHECKS + ("ok",)}
    print(f"{summary['ok']}/{len(rows)} answered well; " + ", ".join(f"{c} {summary[c]}/{len(rows)}" for c in CHECKS))
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
