"""The spec's optional `replaces:` field: which model module an op stands in for.

    replaces:
      layer: RMSNorm                          # the class in <package>.layers (the HF hub layer name)
      modules:                                # module classes whose forward the layer replaces
        - transformers.models.llama.modeling_llama.LlamaRMSNorm
      forward: [hidden_states]                # the replaced forward's parameters, in order (optional)
      args:                                   # op parameter -> where its value comes from
        x: hidden_states                      #   a parameter of forward
        weight: self.weight                   #   an attribute of the module (self.<name>[.<name>])
        eps: self.variance_epsilon
      returns: out                            # multi-output ops: the output(s) forward returns

`replaces` may also be a list of such mappings (one op standing in for several kinds of
module). Every tensor input and every scalar without a default needs an entry in `args`;
scalars with a default may be left out. `forward` defaults to the forward parameters named
in `args`, in the op's parameter order. `returns` defaults to every output (one tensor, or a
tuple in signature order). The field changes only the package's Python layers, never the
kernel, so the lock's spec hash does not cover it.
"""
from __future__ import annotations

import keyword
import re

from pydantic import BaseModel, ConfigDict, Field

from .errors import SpecError

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_DOTTED_CLASS = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+\Z")
_SELF_ATTR = re.compile(r"self(\.[A-Za-z_][A-Za-z0-9_]*)+\Z")
EXAMPLE = ("replaces: {layer: RMSNorm, modules: [transformers.models.llama.modeling_llama.LlamaRMSNorm], "
           "args: {x: hidden_states, weight: self.weight, eps: self.variance_epsilon}}")


class Replaces(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    layer: str
    modules: list[str] = Field(min_length=1)
    forward: list[str] | None = None
    args: dict[str, str]
    returns: str | list[str] | None = None

    @property
    def forward_params(self) -> list[str]:
        """The layer's forward parameters (after self), in order."""
        if self.forward is not None:
            return list(self.forward)
        return [source for source in self.args.values() if not source.startswith("self.")]

    @property
    def returned(self) -> list[str] | None:
        """Output names forward returns (None: all of them, as the op returns them)."""
        if self.returns is None:
            return None
        return [self.returns] if isinstance(self.returns, str) else list(self.returns)

    def single_return(self) -> bool:
        return isinstance(self.returns, str)


def _ident_problem(name: str) -> str | None:
    if not isinstance(name, str) or not _IDENT.fullmatch(name):
        return f"{name!r} is not a Python identifier"
    if keyword.iskeyword(name):
        return f"{name!r} is a Python keyword"
    return None


def check_replaces(spec, pos) -> None:
    """Raise SpecError (file:line of the offending entry) for a `replaces` that cannot work."""
    entries = spec.replaces
    if not entries:
        return
    listed = pos is not None and ("replaces", 0) in pos.values
    sig = spec.signature
    params = {p.name: p for p in sig.params}
    outputs = [o.name for o in sig.outputs]
    layers: dict[str, int] = {}

    for index, entry in enumerate(entries):
        prefix = ("replaces", index) if listed else ("replaces",)

        def fail(message, *path, hint=None, key=False):
            field_path = prefix + tuple(path)
            location = pos.location(field_path, value=not key) if pos is not None else None
            raise SpecError(message, location=location, field=".".join(str(p) for p in field_path),
                            hint=hint or f"e.g. {EXAMPLE}")

        if problem := _ident_problem(entry.layer):
            fail(f"layer: {problem}", "layer", hint="name the layer class, e.g. layer: RMSNorm")
        if entry.layer in layers:
            fail(f"layer {entry.layer!r} is declared twice", "layer", hint="give each replacement its own layer name")
        layers[entry.layer] = index
        for m, module in enumerate(entry.modules):
            if not _DOTTED_CLASS.fullmatch(module):
                fail(f"{module!r} is not a dotted class path", "modules", m,
                     hint="write the module class with its module, e.g. "
                          "transformers.models.llama.modeling_llama.LlamaRMSNorm")
        forward = entry.forward
        if forward is not None:
            seen = set()
            for f, name in enumerate(forward):
                if problem := _ident_problem(name):
                    fail(f"forward parameter {problem}", "forward", f)
                if name == "self":
                    fail("forward lists `self`; list only the parameters after it", "forward", f)
                if name in seen:
                    fail(f"forward parameter {name!r} is listed twice", "forward", f)
                seen.add(name)
        used = set()
        for arg, source in entry.args.items():
            if arg not in params:
                fail(f"{arg!r} is not a parameter of {sig.name}", "args", arg, key=True,
                     hint=f"the op's parameters are: {', '.join(params)}")
            if not isinstance(source, str):
                fail(f"{arg}: give a forward parameter name or self.<attribute> (got {source!r})", "args", arg)
            if source.startswith("self"):
                if not _SELF_ATTR.fullmatch(source):
                    fail(f"{arg}: {source!r} is not an attribute path such as self.weight", "args", arg)
            else:
                if problem := _ident_problem(source):
                    fail(f"{arg}: {problem}; give a forward parameter name or self.<attribute>", "args", arg)
                if forward is not None and source not in forward:
                    fail(f"{arg}: {source!r} is not among forward's parameters ({', '.join(forward) or 'none'})",
                         "args", arg, hint="add it to forward:, or read it from the module as self.<attribute>")
                if forward is None and source in used:
                    fail(f"{arg}: the forward parameter {source!r} feeds two op parameters; list forward: "
                         f"explicitly", "args", arg, hint="e.g. forward: [hidden_states]")
                used.add(source)
        missing = [p.name for p in sig.params if p.name not in entry.args and (p.is_tensor or not p.has_default)]
        if missing:
            fail(f"no source for the op parameter(s) {', '.join(missing)}", "args", key=True,
                 hint="map every tensor input (and every scalar without a default) to a forward parameter "
                      "or self.<attribute>")
        returned = entry.returned
        if returned is not None:
            if not returned:
                fail("returns is empty", "returns", hint=f"name output(s) of {sig.name}: {', '.join(outputs)}")
            for name in returned:
                if name not in outputs:
                    fail(f"{name!r} is not an output of {sig.name}", "returns",
                         hint=f"the outputs are: {', '.join(outputs)} (name outputs in the signature: "
                              f"-> (out: Tensor[...], ...))")
