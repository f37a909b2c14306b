"""Code extraction from real-looking model answers (specgen/agents/extract.py)."""
import pytest

from specgen.agents.extract import ExtractionError, extract_source, fenced_blocks

KERNEL = '''#include <cuda_runtime.h>
#include "gelu_abi.h"
__global__ void k(float* y) { y[0] = 1.0f; }
extern "C" cudaError_t gelu_forward(const gelu_args* a, cudaStream_t stream) {
  k<<<1, 1, 0, stream>>>((float*)a->out.data);
  return cudaGetLastError();
}
'''
ENTRY = ["gelu_forward"]


def test_prose_around_one_fence():
    answer = f"Here is the kernel:\n\n```cuda\n{KERNEL}```\n\nIt uses one thread."
    assert extract_source(answer, ENTRY) == KERNEL


def test_several_fences_picks_the_one_defining_the_entry_point():
    usage = "```cpp\ngelu_args a{};\ngelu_forward(&a, stream);\n```"
    build = "```bash\nnvcc -shared -o libgelu.so gelu.cu\n```"
    answer = f"{usage}\nThe file:\n```cuda\n{KERNEL}```\nBuild it with\n{build}"
    assert extract_source(answer, ENTRY) == KERNEL


def test_several_complete_versions_take_the_last():
    fixed = KERNEL.replace("1.0f", "2.0f")
    answer = f"First try:\n```cuda\n{KERNEL}```\nCorrected:\n```cuda\n{fixed}```"
    assert extract_source(answer, ENTRY) == fixed


def test_untagged_fence_is_accepted():
    assert extract_source(f"```\n{KERNEL}```", ENTRY) == KERNEL


def test_truncated_answer_asks_to_resend_complete_file():
    cut = KERNEL[: KERNEL.index("return")]
    with pytest.raises(ExtractionError, match="cut off.*complete"):
        extract_source(f"```cuda\n{cut}", ENTRY, truncated=True)
    # Unclosed and unbalanced braces: cut off even if the provider did not say so.
    with pytest.raises(ExtractionError, match="cut off"):
        extract_source(f"```cuda\n{cut}", ENTRY)


def test_unclosed_but_complete_fence_is_accepted():
    assert extract_source(f"```cuda\n{KERNEL}", ENTRY) == KERNEL


def test_no_code_at_all_gives_a_clear_retry_message():
    with pytest.raises(ExtractionError) as info:
        extract_source("I cannot write this kernel, sorry.", ENTRY)
    assert "no code block" in str(info.value) and "`gelu_forward`" in str(info.value)
    assert "```cuda" in str(info.value)


def test_bare_source_without_fences_is_accepted():
    assert extract_source(KERNEL, ENTRY) == KERNEL


def test_missing_entry_point_is_named():
    with pytest.raises(ExtractionError, match=r'cudaError_t gelu_backward\(\.\.\.\)'):
        extract_source(f"```cuda\n{KERNEL}```", ["gelu_forward", "gelu_backward"])


def test_split_across_blocks_asks_for_one_block():
    head, tail = KERNEL.split("extern")
    answer = f"```cuda\n{head}```\nand\n```cuda\nextern{tail.replace('gelu_forward', 'gelu_fwd')}```"
    with pytest.raises(ExtractionError, match="ONE code block"):
        extract_source(answer, ENTRY)


def test_four_backtick_fence_with_inner_triple_backticks():
    inner = KERNEL.replace("// x", "")
    text = "````cuda\n" + inner + "// ``` not a close\n````"
    blocks = fenced_blocks(text)
    assert len(blocks) == 1 and blocks[0].closed and "not a close" in blocks[0].code
