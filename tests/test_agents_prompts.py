"""What the prompts carry (specgen/agents/prompts.py + templates/prompts/*.j2)."""
from agents_support import FAST, make_task
from specgen.agents.base import Attempt, Candidate, GpuFacts
from specgen.agents.prompts import conversation, feedback_text, format_timings, SHOWN_ATTEMPTS


def test_task_prompt_carries_the_spec_header_reference_gpu_and_baseline(tmp_path):
    task = make_task(tmp_path)
    task.gpu = GpuFacts("NVIDIA H200", "sm_90", 132, 232448, 60 * 2**20, 3950.0)
    task.baseline = Candidate("// BASELINE KERNEL\n", agent="builtin")
    task.baseline_timings = {"kernel_us": 12.5, "eager_us": 20.0, "roofline_fraction": 0.7}
    system, user = conversation(task, [])
    assert system["role"] == "system" and user["role"] == "user"
    for rule in ("CUDA headers", '"scale_add_abi.h"', 'extern "C" cudaError_t scale_add_forward',
                 "dtype code", "alignment", "No library calls", "given stream", "Never write the inputs",
                 "ONE ```cuda"):
        assert rule in system["content"], rule
    text = user["content"]
    for part in ("y = 2 * x + 1", "scale_add(x: Tensor[N]) -> Tensor[N]", "float32",
                 "N in [1, 1048576]", "N=1048576", "atol=", "def reference(x):",
                 "typedef struct scale_add_args", "NVIDIA H200 (sm_90): 132 SMs", "227 KiB",
                 "3950 GB/s", "// BASELINE KERNEL", "kernel 12.5 us", "70% of the memory roofline",
                 "forward only"):
        assert part in text, part


def test_libraries_and_determinism_change_the_rules(tmp_path):
    task = make_task(tmp_path)
    task.spec = task.spec.model_copy(update={"libraries": ["cublas"], "deterministic": False})
    system = conversation(task, [])[0]["content"]
    assert "Allowed libraries for this op: cublas" in system and "deterministic" not in system


def test_timings_line_compares_with_every_reference_point():
    line = format_timings({"kernel_us": 50.0, "eager_us": 100.0, "compile_us": 40.0, "baseline_us": 50.0,
                           "roofline_fraction": 0.5})
    assert line == ("kernel 50.0 us; eager PyTorch 100.0 us (kernel 2.00x faster); torch.compile 40.0 us "
                    "(kernel 1.25x SLOWER); baseline 50.0 us (kernel 1.00x faster); 50% of the memory roofline")


def test_long_histories_keep_the_best_and_the_latest_with_a_summary(tmp_path):
    task = make_task(tmp_path)
    best = Attempt(Candidate(FAST, "openai"), "done", True, "BEST FEEDBACK",
                   {"score": 10.0, "timings": {"kernel_us": 10.0}})
    history = [best] + [Attempt(Candidate(f"// v{i}\n", "openai"), "compile", False, f"FEEDBACK {i}", {})
                        for i in range(6)]
    messages = conversation(task, history)
    text = "\n".join(m["content"] for m in messages)
    assert "BEST FEEDBACK" in text and "FEEDBACK 5" in text and "FEEDBACK 1" not in text
    assert len(messages) == 2 + 2 * SHOWN_ATTEMPTS
    assert [m["role"] for m in messages[2:]] == ["assistant", "user"] * SHOWN_ATTEMPTS
    assert "#1: correct, kernel 10.0 us" in messages[-1]["content"] and "#7: compile error" in messages[-1]["content"]


def test_feedback_for_each_stage():
    assert "cut off" in feedback_text(1, "extract", False, message="Your answer was cut off")
    assert "error: x" in feedback_text(2, "compile", False, diagnostics="k.cu:1: error: x")
    wrong = feedback_text(3, "verify", False, reason="wrong-result: max abs error 2",
                          counterexample={"shape": "N=7", "dtype": "float32", "where": "tail"})
    assert "Failure: wrong-result" in wrong and "shape: N=7" in wrong and "where: tail" in wrong


def test_the_task_prompt_says_which_inputs_get_no_gradient():
    from pathlib import Path

    from specgen import abi
    from specgen.agents.base import KernelTask
    from specgen.spec import load_spec

    spec = load_spec(Path(__file__).resolve().parent.parent / "specs" / "rope.yaml")
    task = KernelTask(spec=spec, header=abi.header_text(spec), header_name=abi.header_filename(spec))
    text = conversation(task, [])[1]["content"]
    assert "gradients of every floating input except cos, sin (no_grad: the header has no field for them)" in text
    assert "grad_cos" not in text
