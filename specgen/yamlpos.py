"""Load YAML and remember where each key and value sits, so errors can name file:line:col."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from .errors import Location, SpecError

FieldPath = tuple  # ("dims", "N") or ("benchmark", 0, "D")


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


def load_yaml_with_positions(path: Path) -> tuple[object, Positions]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise SpecError(f"cannot read the spec: {error.strerror}", location=Location(path)) from None
    except UnicodeDecodeError as error:
        raise SpecError(f"the spec is not UTF-8 text ({error.reason} at byte {error.start})",
                        location=Location(path)) from None
    pos = Positions(path, {}, {}, {})
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        loc = Location(path, mark.line + 1, mark.column + 1) if mark else Location(path)
        problem = getattr(error, "problem", None) or str(error)
        context = getattr(error, "context", None)
        message = f"YAML syntax error: {problem}" + (f" ({context})" if context else "")
        raise SpecError(message, location=loc,
                        hint="check the indentation and quoting on this line; "
                             "quote signatures that contain ': ' or '#'") from None
    if node is not None:
        _walk(node, (), pos)
    return data, pos
