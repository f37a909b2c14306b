"""Code in a kernel library that runs without being called: at load, at unload, or straight
into the kernel (system calls that bypass the C library).

A candidate's library is built by specgen with fixed flags, so what a clean one holds is
known: `.init_array` = [frame_dummy (crtbegin), nvcc's `__sti____cudaRegisterAll`],
`.fini_array` = [__do_global_dtors_aux], an `_init` that calls only `__gmon_start__`, and no
`syscall` instruction. Anything else is a static constructor or destructor (a global object
with one, `__attribute__((constructor))`, a pointer placed in `.init_array`, code put into
`.init` with inline assembly) or a raw system call (inline `asm("syscall")`), and is refused:
it would run in whatever process loads the library, before or outside any verification.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

# exact names (nvcc's registration function is static: mangled as a local)
_ALLOWED_INIT = {"frame_dummy": "frame_dummy", "_ZL24__sti____cudaRegisterAllv": "cuda",
                 "__sti____cudaRegisterAll": "cuda"}
_ALLOWED_FINI = {"__do_global_dtors_aux": "__do_global_dtors_aux"}


def _run(tool: str, *args: str) -> str | None:
    path = shutil.which(tool)
    if not path:
        return None
    result = subprocess.run([path, *args], capture_output=True, text=True, errors="replace", timeout=120)
    return result.stdout if result.returncode == 0 else None


# `  [19] .init_array       INIT_ARRAY      0000000000295da8 294da8 000010 08  WA  0   0  8`
_SECTION = re.compile(r"^\s*\[\s*\d+\]\s+(?P<name>\S+)\s+(?P<type>\S+)\s+(?P<addr>[0-9a-f]+)\s+(?P<off>[0-9a-f]+)\s+"
                      r"(?P<size>[0-9a-f]+)")
# `0000000000295da8  0000000000000008 R_X86_64_RELATIVE                         29a0`
# `00000000002960c0  0000001300000001 R_X86_64_64            0000000000000000 __gxx_personality_v0@CXXABI_1.3 + 0`
_RELOC = re.compile(r"^(?P<offset>[0-9a-f]+)\s+[0-9a-f]+\s+(?P<type>R_\S+)\s+(?:(?P<value>[0-9a-f]+)\s+"
                    r"(?P<symbol>\S+)\s*\+\s*(?P<addend>[0-9a-f]+)|(?P<relative>[0-9a-f]+))\s*$")
# `   515: 00000000000019a0  3912 FUNC    LOCAL  DEFAULT   12 _ZL24__sti____cudaRegisterAllv`
_SYMBOL = re.compile(r"^\s*\d+:\s+(?P<value>[0-9a-f]+)\s+\d+\s+(?P<type>\w+)\s+\w+\s+\w+\s+\S+\s+(?P<name>\S+)")


def _sections(library: Path) -> dict[str, tuple[int, int, int]]:
    """name -> (address, file offset, size)."""
    text = _run("readelf", "-W", "-S", str(library)) or ""
    found = {}
    for line in text.splitlines():
        if match := _SECTION.match(line):
            found[match["name"]] = (int(match["addr"], 16), int(match["off"], 16), int(match["size"], 16))
    return found


def _relocations(library: Path) -> dict[int, str | int]:
    """offset -> the symbol name a relocation there points at, or the target address (RELATIVE)."""
    text = _run("readelf", "-W", "-r", str(library)) or ""
    found: dict[int, str | int] = {}
    for line in text.splitlines():
        if match := _RELOC.match(line.strip()):
            offset = int(match["offset"], 16)
            if match["relative"] is not None:
                found[offset] = int(match["relative"], 16)
            elif int(match["value"], 16):
                found[offset] = int(match["value"], 16) + int(match["addend"], 16)
            else:
                found[offset] = match["symbol"].split("@")[0]
    return found


def _functions(library: Path) -> dict[int, str]:
    text = _run("readelf", "-W", "-s", str(library)) or ""
    names: dict[int, str] = {}
    for line in text.splitlines():
        if (match := _SYMBOL.match(line)) and match["type"] in ("FUNC", "NOTYPE", "IFUNC"):
            names.setdefault(int(match["value"], 16), match["name"].split("@")[0])
    return names


def _slot_targets(library: Path, section: tuple[int, int, int], relocs: dict, functions: dict) -> list[str]:
    addr, offset, size = section
    raw = Path(library).read_bytes()[offset:offset + size]
    targets = []
    for index in range(0, size - size % 8, 8):
        target = relocs.get(addr + index)
        if target is None:
            target = int.from_bytes(raw[index:index + 8], "little")
        if isinstance(target, int):
            target = functions.get(target, f"code at 0x{target:x}")
        targets.append(target)
    return targets


def _known(name: str, allowed: dict[str, str]) -> str | None:
    """The allowed entry `name` is (each may appear once), or None."""
    return allowed.get(name)


def load_time_code(library: Path) -> list[str]:
    """Refusals for code that runs when the library is loaded or unloaded ([] = none)."""
    sections = _sections(library)
    if not sections:
        return []  # no readelf: undefined_dynamic_symbols has already said so
    problems = []
    for name in (".preinit_array", ".ctors", ".dtors"):
        if name in sections and sections[name][2] > (16 if name != ".preinit_array" else 0):
            problems.append(f"{name}: the library runs code when it is loaded or unloaded (a static constructor "
                            f"or destructor); refused in a kernel")
    relocs, functions = _relocations(library), _functions(library)
    for name, allowed, when in ((".init_array", _ALLOWED_INIT, "loaded"), (".fini_array", _ALLOWED_FINI, "unloaded")):
        if name not in sections:
            continue
        seen: set[str] = set()
        for target in _slot_targets(library, sections[name], relocs, functions):
            key = _known(target, allowed)
            if key is None or key in seen:
                problems.append(f"{target}: runs when the library is {when} ({name}: a static constructor or "
                                f"destructor, a global object with one, or __attribute__((constructor))); "
                                f"refused in a kernel: do the work inside the entry point (no <iostream>, no "
                                f"global objects with constructors)")
            else:
                seen.add(key)
    problems += _init_section_calls(library)
    return problems


def _disassembly(library: Path, *sections: str) -> str | None:
    args = ["-d", "--no-show-raw-insn", "-w"]
    for section in sections:
        args += ["-j", section]
    return _run("objdump", *args, str(library))


def _machine(library: Path) -> str:
    header = _run("readelf", "-W", "-h", str(library)) or ""
    match = re.search(r"Machine:\s+(.+)", header)
    return match.group(1).strip() if match else ""


def _instructions(text: str) -> list[tuple[str, str]]:
    """(address, instruction text) for every disassembled instruction line."""
    found = []
    for line in text.splitlines():
        match = re.match(r"^\s*([0-9a-f]+):\s+(.+)$", line)
        if match:
            found.append((match.group(1), match.group(2).strip()))
    return found


def _init_section_calls(library: Path) -> list[str]:
    """`_init` (crti/crtn) calls __gmon_start__ through a register and nothing else."""
    if "X86-64" not in _machine(library):
        return []
    text = _disassembly(library, ".init")
    if text is None:
        return []
    calls = [(a, i) for a, i in _instructions(text) if re.match(r"(call|jmp)\b", i)]
    extra = [f"0x{a}: {i}" for a, i in calls if not re.match(r"call\s+\*%r[a-z0-9]+$", i)]
    if len(calls) > 1 or extra:
        return [f".init: code added to the library's _init ({'; '.join(extra or [i for _, i in calls])}) runs "
                f"when the library is loaded; refused in a kernel"]
    return []


_RAW_SYSCALL = {"X86-64": re.compile(r"^(syscall|sysenter|int\s+\$0x80)\b"),
                "AArch64": re.compile(r"^svc\b")}


def raw_system_calls(library: Path) -> list[str]:
    """System-call instructions in the library's own code: they bypass every symbol check."""
    machine = _machine(library)
    pattern = next((p for key, p in _RAW_SYSCALL.items() if key in machine), None)
    if pattern is None:
        return []
    text = _disassembly(library)
    if text is None:
        return []
    found = [f"0x{a}" for a, i in _instructions(text) if pattern.match(i)]
    if not found:
        return []
    return [f"a system call instruction at {', '.join(found[:5])}{' ...' if len(found) > 5 else ''}: the kernel "
            f"talks to the operating system directly (inline assembly); refused in a kernel"]
