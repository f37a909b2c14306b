"""Load YAML and remember where each key and value sits, so errors can name file:line:col.

A spec is small: the file, its nesting and what its aliases expand to are bounded
(`MAX_SPEC_BYTES`, `MAX_DEPTH`, `MAX_NODES`), so a hostile file (an alias bomb, YAML nested
thousands deep) is an error with its line, not a process that eats memory or the stack.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from .errors import Location, SpecError

FieldPath = tuple  # ("dims", "N") or ("benchmark", 0, "D")

MAX_SPEC_BYTES = 1 << 20  # 1 MiB: the examples are 1-3 KB
MAX_DEPTH = 32  # nested mappings and sequences; a spec needs 3
MAX_NODES = 100_000  # YAML nodes after expanding aliases


@dataclass
class Positions:
    """1-based (line, column) of each key and each value, by field path."""

    path: Path
    keys: dict[FieldPath, tuple[int, int]]
    values: dict[FieldPath, tuple[int, int]]
    styles: dict[FieldPath, str | None]  # scalar style: None (plain), '"', "'", '|', '>'

    def location(self, field: FieldPath, *, value: bool = True) -> Location:
        """The closest known position for a field path (walking up to its parent)."""
        table = self.values if value else self.keys
        while field:
            if field in table:
                line, col = table[field]
                return Location(self.path, line, col)
            if field in self.keys:
                line, col = self.keys[field]
                return Location(self.path, line, col)
            field = field[:-1]
        return Location(self.path, 1, 1)


def _walk(node, prefix: FieldPath, pos: Positions) -> None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value
            field = prefix + (key,)
            pos.keys[field] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            pos.values[field] = (value_node.start_mark.line + 1, value_node.start_mark.column + 1)
            pos.styles[field] = getattr(value_node, "style", None)
            _walk(value_node, field, pos)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            field = prefix + (index,)
            pos.values[field] = (item.start_mark.line + 1, item.start_mark.column + 1)
            pos.styles[field] = getattr(item, "style", None)
            _walk(item, field, pos)


def _mark_location(path: Path, mark) -> Location:
    return Location(path, mark.line + 1, mark.column + 1) if mark is not None else Location(path)


def _check_shape(text: str, path: Path) -> None:
    """Nesting depth from the event stream (iterative: no recursion however deep the file is)."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise SpecError(f"the YAML is nested more than {MAX_DEPTH} levels deep",
                                location=_mark_location(path, event.start_mark),
                                hint="a spec needs three levels at most (e.g. tolerance: {bfloat16: {atol: ...}})")
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1


def _check_expansion(root, path: Path) -> None:
    """Count the nodes the document expands to through its aliases; refuse cycles and bombs."""
    sizes: dict[int, int] = {}
    stack = [(root, False)]
    active: set[int] = set()
    while stack:
        node, done = stack.pop()
        key = id(node)
        children = []
        if isinstance(node, yaml.MappingNode):
            seen: dict[str, int] = {}  # key -> its line: YAML keeps a repeated key's last value silently
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    raise SpecError("a mapping key must be plain text, not a list or a mapping",
                                    location=_mark_location(path, key_node.start_mark))
                if key_node.value in seen and key_node.value != "<<":
                    raise SpecError(f"`{key_node.value}` is given twice in one mapping (first on line "
                                    f"{seen[key_node.value]}); YAML would keep only this one and drop the first",
                                    location=_mark_location(path, key_node.start_mark),
                                    hint="keep one of the two, with the values you mean")
                seen[key_node.value] = key_node.start_mark.line + 1
                children += [key_node, value_node]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        if done:
            active.discard(key)
            sizes[key] = 1 + sum(sizes[id(child)] for child in children)
            if sizes[key] > MAX_NODES:
                raise SpecError(f"the YAML expands to more than {MAX_NODES} values through its aliases (*name)",
                                location=_mark_location(path, node.start_mark),
                                hint="write the values out; a spec has no need for large aliased structures")
            continue
        if key in sizes:
            continue
        if key in active:
            raise SpecError("a YAML alias refers to a node that contains it (a recursive structure)",
                            location=_mark_location(path, node.start_mark))
        active.add(key)
        stack.append((node, True))
        for child in children:
            if id(child) in active:
                raise SpecError("a YAML alias refers to a node that contains it (a recursive structure)",
                                location=_mark_location(path, child.start_mark))
            if id(child) not in sizes:
                stack.append((child, False))


def load_yaml_with_positions(path: Path) -> tuple[object, Positions]:
    try:
        if path.is_dir():
            raise SpecError("this is a folder, not a spec file", location=Location(path))
        size = path.stat().st_size
        if size > MAX_SPEC_BYTES:
            raise SpecError(f"the spec is {size} bytes; a spec file is at most {MAX_SPEC_BYTES} bytes",
                            location=Location(path))
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise SpecError(f"cannot read the spec: {error.strerror or error}", location=Location(path)) from None
    except UnicodeDecodeError as error:
        raise SpecError(f"the spec is not UTF-8 text ({error.reason} at byte {error.start})",
                        location=Location(path)) from None
    pos = Positions(path, {}, {}, {})
    try:
        _check_shape(text, path)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        if node is not None:
            _check_expansion(node, path)
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        loc = _mark_location(path, mark)
        problem = getattr(error, "problem", None) or str(error)
        context = getattr(error, "context", None)
        message = f"YAML syntax error: {problem}" + (f" ({context})" if context else "")
        raise SpecError(message, location=loc,
                        hint="check the indentation and quoting on this line; "
                             "quote signatures that contain ': ' or '#'") from None
    except (ValueError, OverflowError, RecursionError) as error:  # e.g. an integer of 5000 digits
        raise SpecError(f"a YAML value cannot be read: {error}", location=Location(path)) from None
    if node is not None:
        _walk(node, (), pos)
    return data, pos
