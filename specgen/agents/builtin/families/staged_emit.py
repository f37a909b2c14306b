"""One kernel file for a staged program: each stage's own kernel text, then the entry points that
run the stages in order.

Each stage's source is what build_source writes for its spec (its family's emitter), placed in a
namespace of its own with its entry points' C linkage taken off (only the composite's entry
points are exported), its macros undefined after it, and its ABI structs above it. The handed-
over values live at the front of the composite's workspace, each 256-byte aligned; behind them
each stage gets the rest as its own workspace (stages run one after another on the stream, so
they share it). The size function asks each stage's size function with its real arguments,
the handed-over values at a stand-in base with the workspace's alignment.
"""
from __future__ import annotations

import re
from pathlib import Path

from .... import abi

_PROTOTYPES = re.compile(r'#ifdef __cplusplus\nextern "C" \{\n#endif\n.*?#ifdef __cplusplus\n\}\n#endif\n', re.S)
_ITEMSIZE = {"float32": 4, "int64": 8, "bool": 1}
_DTYPE_CODE = {"float32": "SPECGEN_FLOAT32", "int64": "SPECGEN_INT64", "bool": "SPECGEN_BOOL"}
HOST_HELPERS = """namespace staged_host {
inline size_t round256(size_t n) { return (n + 255) / 256 * 256; }
// a contiguous tensor at `data` (a handed-over value in the workspace)
inline specgen_tensor tensor_at(void* data, int32_t dtype, int ndim, const int64_t* sizes) {
  specgen_tensor t = {};
  t.data = data;
  t.ndim = ndim;
  t.dtype = dtype;
  int64_t stride = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    t.sizes[d] = sizes[d];
    t.strides[d] = stride;
    stride *= sizes[d];
  }
  return t;
}
}  // namespace staged_host"""


def stage_structs(stage_spec) -> str:
    """The stage's ABI header without its C prototypes (its entry points are not exported)."""
    return _PROTOTYPES.sub("", abi.header_text(stage_spec))


def stage_block(stage_spec, source: str) -> tuple[list[str], str]:
    """(the #include lines, the rest in the stage's namespace (a named one: an unnamed one makes
    nvcc warn of every prelude helper the stage does not use), its macros undefined after it)."""
    includes, body = [], []
    for line in source.splitlines():
        if line.startswith("#include"):
            if abi.header_filename(stage_spec) not in line:
                includes.append(line)
        else:
            body.append(line)
    text = re.sub(r'extern "C"\s+', "", "\n".join(body))
    macros = list(dict.fromkeys(re.findall(r"^\s*#\s*define\s+(\w+)", text, re.M)))
    namespace = f"stage_{stage_spec.name}"
    block = (f"namespace {namespace} {{\n{text}\n}}  // namespace {namespace}\n"
             + "".join(f"#undef {m}\n" for m in macros))
    return includes, block


def _size_c(ttype, prefix: str) -> list[str]:
    return [d.c_expr(prefix) for d in ttype.dims]


class DirectionDriver:
    """The entry point and size function of one direction of the composite."""

    def __init__(self, spec, program, sources: list[str]):
        self.spec, self.program, self.sources = spec, program, sources
        self.direction = program.direction
        self.args = abi.struct_name(spec, self.direction)
        self.tag = f"{spec.name}_{self.direction}"
        self.mids = list(program.mids.items())

    def text(self) -> str:
        return "\n\n".join([self.layout(), *[self.fill(k) for k in range(len(self.program.stages))],
                            self.size_function(), self.entry()])

    def layout(self) -> str:
        lines = ["// the handed-over values' offsets in the workspace; returns their bytes",
                 f"static size_t {self.tag}_mids(const {self.args}* a, size_t* at) {{", "  size_t used = 0;"]
        for i, (name, ttype) in enumerate(self.mids):
            count = " * ".join(f"(size_t)({c})" for c in _size_c(ttype, "a->")) or "(size_t)1"
            lines += [f"  at[{i}] = used;  // {name}: {ttype}",
                      f"  used += staged_host::round256({count} * {_ITEMSIZE[ttype.dtype]});"]
        lines += ["  return used;", "}"]
        return "\n".join(lines)

    def fill(self, k: int) -> str:
        stage = self.program.stages[k]
        sub = stage.spec
        lines = [f"static void {self.tag}_stage{k}(const {self.args}* a, char* base, const size_t* at, "
                 f"{abi.struct_name(sub, 'forward')}* s) {{"]
        index = {name: i for i, (name, _) in enumerate(self.mids)}
        for f in abi.fields(sub, "forward"):
            if f.role == "workspace":
                continue
            if f.name in index:
                ttype = self.program.mids[f.name]
                sizes = ", ".join(_size_c(ttype, "a->")) or "0"
                lines.append(f"  {{ const int64_t sizes[] = {{{sizes}}}; s->{f.name} = staged_host::tensor_at("
                             f"base + at[{index[f.name]}], {_DTYPE_CODE[ttype.dtype]}, {len(ttype.dims)}, sizes); }}")
            else:
                lines.append(f"  s->{f.name} = a->{f.name};")
        lines.append("}")
        return "\n".join(lines)

    def has_workspace(self, k: int) -> bool:
        return abi.names_workspace_function(self.program.stages[k].spec, self.sources[k], "forward")

    def call(self, k: int, what: str) -> str:
        sub = self.program.stages[k].spec
        return f"stage_{sub.name}::{abi.entry_point(sub, 'forward')}{what}"

    def size_function(self) -> str:
        lines = [f'extern "C" size_t {abi.workspace_function(self.spec, self.direction)}(const {self.args}* a) {{',
                 f"  size_t at[{max(1, len(self.mids))}];",
                 f"  const size_t mids = {self.tag}_mids(a, at);",
                 "  char* base = (char*)(uintptr_t)65536;  // stands for the workspace: 256-byte aligned as it is",
                 "  size_t most = 0;"]
        for k, stage in enumerate(self.program.stages):
            if not self.has_workspace(k):
                continue
            lines += [f"  {{ {abi.struct_name(stage.spec, 'forward')} s = {{}};",
                      f"    {self.tag}_stage{k}(a, base, at, &s);",
                      "    s.workspace = base + mids;",
                      f"    const size_t need = {self.call(k, '_workspace')}(&s);",
                      "    if (need > most) most = need; }"]
        lines += ["  return mids + most;", "}"]
        return "\n".join(lines)

    def entry(self) -> str:
        lines = [f'extern "C" cudaError_t {abi.entry_point(self.spec, self.direction)}(const {self.args}* a, '
                 f"cudaStream_t stream) {{",
                 f"  if ((size_t)a->workspace_bytes < {abi.workspace_function(self.spec, self.direction)}(a)) "
                 f"return cudaErrorInvalidValue;",
                 f"  size_t at[{max(1, len(self.mids))}];",
                 f"  const size_t mids = {self.tag}_mids(a, at);",
                 "  char* base = (char*)a->workspace;"]
        for k, stage in enumerate(self.program.stages):
            lines += [f"  {{ {abi.struct_name(stage.spec, 'forward')} s = {{}};  // stage {k}: "
                      f"{', '.join(stage.inputs)} -> {', '.join(stage.outputs)}",
                      f"    {self.tag}_stage{k}(a, base, at, &s);"]
            if self.has_workspace(k):
                lines += ["    s.workspace = base + mids;",
                          "    s.workspace_bytes = a->workspace_bytes - (int64_t)mids;"]
            lines += [f"    const cudaError_t e = {self.call(k, '')}(&s, stream);",
                      "    if (e != cudaSuccess) return e; }"]
        lines += ["  return cudaSuccess;", "}"]
        return "\n".join(lines)


class InlinedKernels:
    """Kernel texts of other specs (stages, specialized kernels) placed in one file: their
    #includes once, their ABI structs, each text in its namespace (stage_block)."""

    def __init__(self, variant):
        self.variant, self.includes, self.structs, self.blocks = variant, [], [], []

    def add(self, sub_spec, title: str) -> str:
        """Place `sub_spec`'s kernel text; returns the text as build_source wrote it."""
        from ..generator import build_source

        source = build_source(sub_spec, self.variant)
        found, block = stage_block(sub_spec, source)
        self.includes += [line for line in found if line not in self.includes]
        self.structs.append(stage_structs(sub_spec))
        self.blocks.append(f"// ======================= {title} =======================\n{block}")
        return source

    def file(self, head: list[str], helpers: list[str], drivers: list[str]) -> str:
        return "\n\n".join(["\n".join(head + self.includes), *self.structs, *helpers, *self.blocks, *drivers]) + "\n"


def emit_staged_source(spec, programs: dict, variant) -> str:
    head = [f"// {spec.name}.cu: generated by specgen's builtin generator from {Path(str(spec.path)).name}.",
            f"//   {spec.signature}",
            "// Staged: no single kernel takes this reference, so each direction runs as stages in order,",
            "// each a kernel of the builtin generator's families (its own spec, its own text below, in a",
            "// namespace of its own), the values handed between them in the workspace (float32).",
            f"// Schedule variant: {variant.name}.",
            f'#include "{abi.header_filename(spec)}"']
    kernels, drivers = InlinedKernels(variant), []
    for program in programs.values():
        sources = [kernels.add(stage.spec, f"stage {stage.spec.name}") for stage in program.stages]
        drivers.append(f"// ======================= {program.direction}: the stages in order "
                       f"=======================\n" + DirectionDriver(spec, program, sources).text())
    return kernels.file(head, [HOST_HELPERS], drivers)
