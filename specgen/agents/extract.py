"""Pull the kernel source out of a model's answer.

Real answers wrap the code in prose, give several fenced blocks (the kernel, a usage
example, a build line), or get cut off by the token limit. Each failure produces a message
written *to the model*, so the next attempt can fix it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

# Languages a fenced block of the kernel file is usually tagged with.
CODE_LANGUAGES = {"cuda", "cu", "cpp", "c++", "cxx", "c", "cc", "h", "hpp", "cuh"}
_FENCE = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})\s*(?P<info>[^\s`]*)[^`]*$")


class ExtractionError(ValueError):
    """No usable source in the answer; the message is the retry request for the model."""


@dataclass
class Block:
    language: str
    code: str
    closed: bool


def fenced_blocks(text: str) -> list[Block]:
    """Every fenced code block in `text`, in order; an unclosed last block is kept, open."""
    blocks: list[Block] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        fence = opening.group("fence")
        language = opening.group("info").lower()
        body: list[str] = []
        index += 1
        closed = False
        while index < len(lines):
            stripped = lines[index].strip()
            if stripped.startswith(fence[0] * len(fence)) and not stripped.strip(fence[0]):
                closed = True
                index += 1
                break
            body.append(lines[index])
            index += 1
        blocks.append(Block(language, "\n".join(body).strip("\n") + "\n", closed))
    return blocks


def defines(code: str, entry_point: str) -> bool:
    """Whether `code` defines `entry_point` (a parameter list followed by a body, not a call)."""
    return re.search(rf"\b{re.escape(entry_point)}\s*\([^;{{}}]*\)\s*\{{", code) is not None


def _braces_balanced(code: str) -> bool:
    # Strip comments and string/char literals so their braces do not count.
    code = re.sub(r"//[^\n]*|/\*.*?\*/|\"(?:\\.|[^\"\\])*\"|'(?:\\.|[^'\\])*'", "", code, flags=re.S)
    return code.count("{") == code.count("}") and code.count("{") > 0


def _resend_truncated() -> str:
    return ("Your answer was cut off before the code block ended (the output token limit was "
            "reached). Resend the complete .cu file in a single ```cuda block, with less prose "
            "and no repeated code; shorten comments if needed.")


def extract_source(text: str, entry_points: list[str], *, truncated: bool = False) -> str:
    """The complete .cu source in `text`, or ExtractionError with a message for the model.

    `entry_points` are the C functions the file must define (e.g. ["gelu_forward"]);
    `truncated` is the provider's word that the answer hit the token limit.
    """
    wanted = ", ".join(f"`{name}`" for name in entry_points)
    blocks = fenced_blocks(text)
    if not blocks:
        bare = text.strip()
        if bare and all(defines(bare, name) for name in entry_points) and "#include" in bare:
            if truncated and not _braces_balanced(bare):
                raise ExtractionError(_resend_truncated())
            return bare + "\n"  # a bare file without fences: accept it as is
        if truncated:
            raise ExtractionError(_resend_truncated())
        raise ExtractionError(
            "Your answer contained no code block. Reply with the complete .cu file "
            f"(defining {wanted}) in one ```cuda fenced block.")

    chosen = _choose(blocks, entry_points)
    if not chosen.closed and (truncated or not _braces_balanced(chosen.code)):
        raise ExtractionError(_resend_truncated())
    missing = [name for name in entry_points if not defines(chosen.code, name)]
    if missing:
        names = ", ".join(f'extern "C" cudaError_t {name}(...)' for name in missing)
        several = (" Put the whole kernel file in ONE code block; do not split it."
                   if len(blocks) > 1 else "")
        raise ExtractionError(
            f"The code block does not define {names}. Reply with the complete .cu file "
            f"defining {wanted} in one ```cuda block.{several}")
    return chosen.code


def _choose(blocks: list[Block], entry_points: list[str]) -> Block:
    """The block most likely to be the kernel file.

    Preference: defines the most entry points, then is tagged as C/C++/CUDA, then comes
    last (a model that corrects itself puts the final version last).
    """
    def score(item: tuple[int, Block]):
        position, block = item
        defined = sum(defines(block.code, name) for name in entry_points)
        return (defined, block.language in CODE_LANGUAGES, position)

    return max(enumerate(blocks), key=score)[1]
