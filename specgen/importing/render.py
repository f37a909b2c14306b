"""An ImportedSpec as YAML a person reads: the flags as comments on top, a block reference."""
from __future__ import annotations

import json
import textwrap

import yaml

from .. import __version__


def _flow(mapping: dict) -> str:
    return "{" + ", ".join(f"{k}: {list(v) if isinstance(v, tuple) else v}" for k, v in mapping.items()) + "}"


def _block(text: str) -> str:
    """A `|` block when it round-trips exactly, else a quoted scalar."""
    body = textwrap.indent(text.rstrip("\n") + "\n", "  ", lambda line: True)
    candidate = "|\n" + "\n".join(line.rstrip() if not line.strip() else line for line in body.split("\n"))
    try:
        if yaml.safe_load("x: " + candidate)["x"].rstrip("\n") == text.rstrip("\n") and "\t" not in text[:1]:
            return candidate.rstrip(" ")
    except yaml.YAMLError:
        pass
    return json.dumps(text)


def render_yaml(spec) -> str:
    lines = [f"# Written by `specgen import` (specgen {__version__}) from {spec.source}.",
             "# Review it before building: `specgen check` runs it, `specgen build` turns it into a kernel."]
    if spec.flags:
        lines.append("# To confirm:")
        for flag in spec.flags:
            wrapped = textwrap.wrap(flag, 96, initial_indent="#   - ", subsequent_indent="#     ")
            lines += wrapped
    lines.append(f"name: {spec.name}")
    description = yaml.safe_dump({"description": spec.description}, width=96, allow_unicode=True).rstrip()
    lines.append(description)
    lines.append(f"signature: {json.dumps(spec.signature)}")
    lines.append(f"dtypes: [{', '.join(spec.dtypes)}]")
    if spec.dims:
        lines.append(f"dims: {_flow(spec.dims)}")
    if spec.reference_mode == "import":
        lines.append(f"reference: {spec.reference}   # imported by path: the model code is not copied")
    else:
        lines.append(f"reference: {_block(spec.reference)}")
    lines.append(f"backward: {spec.backward}")
    if spec.benchmark:
        lines.append("benchmark:")
        lines += [f"  - {_flow(shape)}" for shape in spec.benchmark]
    return "\n".join(lines).rstrip("\n") + "\n"
