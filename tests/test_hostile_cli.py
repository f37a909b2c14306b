"""Issue 14, the command line: bad arguments and broken files are usage errors (exit 2) or
refusals (exit 1) with a clear message and no traceback (cases 7, 9, 10); files keep the mode
the user's umask gives (case 8); an interrupted or killed run leaves no temporary folders and
no children behind (case 11); `specgen verify --locked` re-verifies every locked kernel
(case 12)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specgen import lock as lock_module
from specgen.cli import main
from specgen.fsutil import write_atomic
from specgen.lock import Lock
from specgen.spec import load_spec

from test_build import folder, stub_wheel  # noqa: F401 - fixtures
from test_package import SWIGLU_CU

REPO = Path(__file__).resolve().parent.parent
SPECS = REPO / "specs"


def usage_exit(argv: list[str]) -> int:
    """argparse's own refusals end in SystemExit(2); everything else returns a code."""
    try:
        return main(argv)
    except SystemExit as stop:
        return stop.code


# ---------------------------------------------------------------------------- case 7

def test_the_lock_being_a_folder_is_a_clear_error(folder, tmp_path, stub_wheel, capsys):  # noqa: F811
    (folder / "specgen.lock").mkdir()
    assert main(["build", str(folder), "--locked", "-o", str(tmp_path / "dist")]) == 1
    assert "specgen.lock: is a folder" in capsys.readouterr().err


def test_a_kernel_path_being_a_folder_is_a_clear_error(folder, tmp_path, stub_wheel, capsys):  # noqa: F811
    (folder / "kernels" / "swiglu.cu").mkdir(parents=True)
    assert main(["build", str(folder / "swiglu.yaml"), "-o", str(tmp_path / "dist")]) == 1
    assert "swiglu.cu: is a folder, not a kernel file" in capsys.readouterr().err


def test_a_non_utf8_kernel_file_is_a_clear_error(folder, tmp_path, stub_wheel, monkeypatch, capsys):  # noqa: F811
    Lock.load(folder).write_kernel(load_spec(folder / "swiglu.yaml"), SWIGLU_CU, agent="hand")
    (folder / "kernels" / "swiglu.cu").write_bytes(b"\xff\xfe not utf-8 \x80")
    assert main(["build", str(folder / "swiglu.yaml"), "-o", str(tmp_path / "dist")]) == 1
    assert "swiglu.cu: the kernel is not UTF-8 text" in capsys.readouterr().err


@pytest.mark.parametrize("option", ["-o", "--keep-tree", "--hub-layout"])
def test_output_folders_that_are_files_are_usage_errors(folder, tmp_path, stub_wheel, capsys, option):  # noqa: F811
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    argv = ["build", str(folder), option, str(blocker)] + (["-o", str(tmp_path / "d")] if option != "-o" else [])
    assert main(argv) == 2
    assert "is a file, not a folder" in capsys.readouterr().err


def test_init_dir_and_header_output_that_are_files(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main(["init", "my_op", "--dir", str(blocker)]) == 2
    assert main(["init", "my_op", "--dir", str(blocker / "sub")]) == 2
    assert main(["header", str(SPECS / "swiglu.yaml"), "-o", str(blocker)]) == 2
    err = capsys.readouterr().err
    assert err.count("is a file, not a folder") == 3 and "which is a file" in err


@pytest.mark.parametrize("content, words", [
    (b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)), "binary data"),
    (b"__global__ void k() {}\n\xff\xfe\n", "not UTF-8 text"),
    (b"", "the file is empty"),
])
def test_compile_kernel_argument_must_be_cuda_text(tmp_path, capsys, content, words):
    kernel = tmp_path / "k.cu"
    kernel.write_bytes(content)
    assert main(["compile", str(SPECS / "swiglu.yaml"), "--kernel", str(kernel)]) == 2
    assert words in capsys.readouterr().err


def test_kernel_argument_that_is_a_device_or_a_folder(tmp_path, capsys):
    assert main(["compile", str(SPECS / "swiglu.yaml"), "--kernel", "/dev/null"]) == 2
    assert main(["compile", str(SPECS / "swiglu.yaml"), "--kernel", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "not a regular file" in err and "is a folder" in err and "no such file" not in err


# ---------------------------------------------------------------------------- case 9

@pytest.mark.parametrize("argv, words", [
    (["generate", "specs", "--target-roofline", "5"], "not a fraction"),
    (["build", "specs", "--target-roofline", "0"], "not a fraction"),
    (["build", "specs", "--jobs", "-3"], "must be at least 1"),
    (["generate", "specs", "--attempts", "0"], "must be at least 1"),
    (["generate", "specs", "--retries", "-1"], "must be 0 or more"),
    (["check", "specs", "--samples", "-2"], "must be at least 1"),
    (["check", "specs", "--seed", str(2**70)], "too large for a seed"),
    (["bench", "specs/gelu_tanh.yaml", "--reps", "0"], "must be at least 1"),
    (["generate", "specs", "--budget-usd", "nan"], "must be a number >= 0"),
])
def test_numeric_options_are_checked_up_front(capsys, argv, words):
    assert usage_exit(argv) == 2
    assert words in capsys.readouterr().err


@pytest.mark.parametrize("shape, words", [("N=99999999,D=4", "outside the spec's dims.N"),
                                          ("N=1" + "0" * 30 + ",D=4", "write SYMBOL=SIZE"),
                                          ("N=-1,D=4", "write SYMBOL=SIZE")])
def test_bench_shapes_outside_the_dims_are_usage_errors(capsys, shape, words):
    assert main(["bench", str(SPECS / "gelu_tanh.yaml"), "--shape", shape, "--no-compile"]) == 2
    assert words in capsys.readouterr().err


def test_a_transcript_dir_that_is_a_file_is_a_usage_error(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main(["generate", str(SPECS / "swiglu.yaml"), "--transcript-dir", str(blocker)]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err


# ---------------------------------------------------------------------------- case 10

def test_an_unknown_lock_version_does_not_advise_regenerate(folder, tmp_path, stub_wheel, capsys):  # noqa: F811
    (folder / "specgen.lock").write_text('{"version": 99, "ops": {}}')
    assert main(["build", str(folder), "--locked", "-o", str(tmp_path / "dist")]) == 1
    err = capsys.readouterr().err
    assert "lock version 99" in err and "--regenerate" not in err and "move the lock away" in err


@pytest.mark.parametrize("url", ["garbage", "localhost:8000", "http://", "http://host:99999/v1", "ftp://x/v1",
                                 "http://exa mple.com/v1"])
def test_a_garbage_base_url_is_a_usage_error(tmp_path, capsys, url):
    specs = tmp_path / "specs"
    specs.mkdir()
    shutil.copy(SPECS / "swiglu.yaml", specs)
    code = main(["generate", str(specs), "--agent", "openai-compatible", "--base-url", url, "--model", "m"])
    assert code == 2 and "--base-url" in capsys.readouterr().err


def test_init_refuses_a_name_check_would_reject(tmp_path, capsys):
    for name in ("scalé", "class", "torch", "x" * 300):
        assert main(["init", name, "--dir", str(tmp_path)]) == 2
    assert not list(tmp_path.iterdir())
    assert "not an ASCII identifier" in capsys.readouterr().err


# ---------------------------------------------------------------------------- case 8

@pytest.fixture
def umask_022():
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_written_files_get_the_umask_mode_and_keep_their_mode(tmp_path, umask_022):
    new = write_atomic(tmp_path / "new.txt", "x")
    assert mode(new) == 0o644
    existing = tmp_path / "group.txt"
    existing.write_text("old")
    existing.chmod(0o664)
    write_atomic(existing, "new")
    assert mode(existing) == 0o664 and existing.read_text() == "new"


def test_lock_kernels_and_init_specs_are_readable_by_others(tmp_path, umask_022, monkeypatch):
    assert main(["init", "my_op", "--dir", str(tmp_path / "specs")]) == 0
    assert mode(tmp_path / "specs" / "my_op.yaml") == 0o644
    folder = tmp_path / "lockdir"  # noqa: F811 - a local folder, not the fixture
    folder.mkdir()
    shutil.copy(SPECS / "swiglu.yaml", folder)
    spec = load_spec(folder / "swiglu.yaml")
    Lock.load(folder).write_kernel(spec, SWIGLU_CU, agent="hand")
    assert mode(folder / "specgen.lock") == 0o644 and mode(folder / "kernels" / "swiglu.cu") == 0o644
    (folder / "specgen.lock").chmod(0o644)
    Lock.load(folder).write_kernel(spec, SWIGLU_CU + "\n", agent="hand", regenerate=True)  # a rewrite
    assert mode(folder / "specgen.lock") == 0o644


# ---------------------------------------------------------------------------- case 11

FAKE_NVCC = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "Cuda compilation tools, release 13.0, V13.0.88"; exit 0; fi
sleep 600 &
echo $! > "$FAKE_NVCC_PID.child"
echo $$ > "$FAKE_NVCC_PID"
wait
"""


def fake_toolkit(root: Path) -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "include").mkdir()
    (root / "lib64").mkdir()
    (root / "include" / "cuda_runtime.h").write_text("")
    (root / "lib64" / "libcudart.so").write_text("")
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text(FAKE_NVCC)
    nvcc.chmod(0o755)
    return root


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def wait_until(condition, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def as_a_shell_starts_it() -> None:
    """The child starts as a user's shell starts a command: the stop signals unblocked and at
    their defaults. A test run started in the background by a non-interactive shell
    (`.ci/run &`) has SIGINT ignored (SigIgn 0x1001007 in /proc), and its children inherit
    that: such a command rightly ignores Ctrl-C, and the test timed out."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


def start_compile(tmp_path: Path) -> tuple[subprocess.Popen, Path, Path]:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    kernel = tmp_path / "k.cu"
    kernel.write_text("// a kernel\n")
    pid_file = tmp_path / "nvcc.pid"
    env = dict(os.environ, CUDA_HOME=str(fake_toolkit(tmp_path / "cuda")), TMPDIR=str(scratch),
               FAKE_NVCC_PID=str(pid_file), SPECGEN_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    process = subprocess.Popen([sys.executable, "-m", "specgen.cli", "compile", str(SPECS / "swiglu.yaml"),
                                "--kernel", str(kernel), "--arch", "sm_90"], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, preexec_fn=as_a_shell_starts_it)
    child_file = Path(f"{pid_file}.child")
    assert wait_until(lambda: pid_file.exists() and child_file.exists() and child_file.read_text().strip()
                      and pid_file.read_text().strip(), 120), process.poll()
    return process, scratch, pid_file


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 128 + signal.SIGTERM), (signal.SIGINT, 130),
                                          (signal.SIGHUP, 128 + signal.SIGHUP)])
def test_an_interrupted_compile_leaves_no_folders_and_no_children(tmp_path, signum, code):
    process, scratch, pid_file = start_compile(tmp_path)
    nvcc, child = int(pid_file.read_text()), int(Path(f"{pid_file}.child").read_text())
    assert list(scratch.glob("specgen-build-*")) and list(scratch.glob("specgen-abi-*"))
    process.send_signal(signum)
    try:
        out, err = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:  # say where it hung (py-spy is not here: its output so far)
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"still running 60 s after signal {signum}; its output:\n{out}\n{err}")
    assert process.returncode == code, err
    assert "Traceback" not in err
    assert wait_until(lambda: not alive(nvcc) and not alive(child), 20)
    assert not list(scratch.iterdir()), list(scratch.iterdir())


def test_a_killed_compile_takes_its_children_and_build_folder_with_it(tmp_path):
    process, scratch, pid_file = start_compile(tmp_path)
    nvcc, child = int(pid_file.read_text()), int(Path(f"{pid_file}.child").read_text())
    process.kill()
    process.wait(timeout=30)
    assert wait_until(lambda: not alive(nvcc) and not alive(child), 20)
    assert wait_until(lambda: not list(scratch.glob("specgen-build-*")), 20)


# ---------------------------------------------------------------------------- case 12

class FakeVerdict:
    def __init__(self, passed: bool, reason: str):
        self.passed, self.reason = passed, reason
        self.timings = {"compile_s": 1.5, "verify_s": 42.0}

    def summary(self) -> str:
        return f"{self.reason}: {'all cases passed' if self.passed else 'max abs error 3.2 at x[0, 7]'}\ndetail"


@pytest.fixture
def locked_folder(folder, monkeypatch):  # noqa: F811
    for name in ("swiglu", "cross_entropy"):
        Lock.load(folder).write_kernel(load_spec(folder / f"{name}.yaml"), SWIGLU_CU.replace("swiglu", name),
                                       agent="hand")
    return folder


def test_verify_locked_reverifies_every_locked_kernel_and_fails_on_any(locked_folder, monkeypatch, capsys):
    monkeypatch.setattr(lock_module, "gpu_available", lambda: True)
    calls = []

    def fake_verify(spec, kernel, **options):
        calls.append((spec.name, Path(kernel).name))
        return FakeVerdict(spec.name != "cross_entropy", "passed" if spec.name != "cross_entropy" else "wrong-result")

    monkeypatch.setattr("specgen.verify.verify_kernel", fake_verify)
    assert main(["verify", "--locked", str(locked_folder)]) == 1
    out = capsys.readouterr().out
    assert sorted(calls) == [("cross_entropy", "cross_entropy.cu"), ("swiglu", "swiglu.cu")]
    assert "FAILED cross_entropy: wrong-result" in out and "ok swiglu" in out and "1 of 2" in out
    assert "max abs error 3.2 at x[0, 7]" in out  # why it failed, not only that it did
    json_out = locked_folder / "verdicts.json"
    assert main(["verify", "--locked", str(locked_folder), "--json", str(json_out)]) == 1
    written = json.loads(json_out.read_text())
    assert "max abs error 3.2" in written["cross_entropy"]["detail"]
    assert written["swiglu"]["timings"] == {"compile_s": 1.5, "verify_s": 42.0}  # each verdict's phase seconds

    capsys.readouterr()
    assert main(["verify", "--locked", str(locked_folder), "--json", "-"]) == 1  # JSON alone on stdout
    on_stdout = json.loads(capsys.readouterr().out)
    assert on_stdout["cross_entropy"]["reason"] == "wrong-result" and on_stdout["swiglu"]["passed"]

    monkeypatch.setattr("specgen.verify.verify_kernel", lambda spec, kernel, **o: FakeVerdict(True, "passed"))
    assert main(["verify", "--locked", str(locked_folder)]) == 0
    assert "all 2 locked kernel(s) verified" in capsys.readouterr().out


def test_verify_locked_keeps_the_verdicts_so_far_when_stopped(locked_folder, monkeypatch):
    """A run stopped mid-way (a GPU call's budget) leaves the verdicts it reached in --json."""
    monkeypatch.setattr(lock_module, "gpu_available", lambda: True)
    json_out = locked_folder / "verdicts.json"
    done = []

    def verify_then_stop(spec, kernel, **options):
        if done:
            raise KeyboardInterrupt  # the second kernel is stopped before its verdict
        done.append(spec.name)
        return FakeVerdict(True, "passed")

    monkeypatch.setattr("specgen.verify.verify_kernel", verify_then_stop)
    assert main(["verify", "--locked", str(locked_folder), "--json", str(json_out)]) == 130  # interrupted
    written = json.loads(json_out.read_text())
    assert list(written) == done and written[done[0]]["passed"] and written[done[0]]["timings"]["verify_s"] == 42.0


def test_verify_locked_verifies_an_edited_kernel_as_it_is(locked_folder, monkeypatch, capsys):
    monkeypatch.setattr(lock_module, "gpu_available", lambda: True)
    kernel = locked_folder / "kernels" / "swiglu.cu"
    kernel.write_text(kernel.read_text() + "// edited, and its hash rewritten in the lock\n")
    seen = {}
    monkeypatch.setattr("specgen.verify.verify_kernel",
                        lambda spec, k, **o: seen.setdefault(spec.name, Path(k).read_text()) and FakeVerdict(
                            spec.name != "swiglu", "wrong-result" if spec.name == "swiglu" else "passed"))
    assert main(["verify", "--locked", str(locked_folder)]) == 1
    assert "edited" in seen["swiglu"] and "differs from the locked one" in capsys.readouterr().out


def test_verify_locked_without_a_gpu_exits_3(locked_folder, monkeypatch, capsys):
    monkeypatch.setattr(lock_module, "gpu_available", lambda: False)
    monkeypatch.setattr("specgen.verify.verify_kernel", lambda *a, **k: pytest.fail("ran without a GPU"))
    assert main(["verify", "--locked", str(locked_folder)]) == 3
    assert "not a proof" in capsys.readouterr().err


def test_verify_locked_with_nothing_locked_and_bad_combinations(folder, capsys):  # noqa: F811
    assert main(["verify", "--locked", str(folder)]) == 2
    assert main(["verify", "--locked", str(folder), "--kernel", "k.cu"]) == 2
    assert main(["verify", str(folder / "swiglu.yaml")]) == 2
    err = capsys.readouterr().err
    assert "no locked kernels" in err and "takes no --kernel" in err and "--kernel FILE.cu" in err


# ---------------------------------------------------------------------------- no traceback, ever

def test_an_unexpected_exception_is_reported_without_a_traceback(monkeypatch, capsys):
    def broken(args):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr("specgen.commands.header.run", broken)
    monkeypatch.delenv("SPECGEN_DEBUG", raising=False)
    assert main(["header", str(SPECS / "swiglu.yaml")]) == 1
    err = capsys.readouterr().err
    assert "internal error" in err and "ZeroDivisionError: boom" in err and "Traceback" not in err


def test_verify_locked_record_adds_a_record_for_each_kernel_that_passes(locked_folder, monkeypatch, capsys):
    from types import SimpleNamespace

    from specgen.agents import evaluate

    monkeypatch.setattr(lock_module, "gpu_available", lambda: True)
    monkeypatch.setattr(evaluate, "gpu_facts", lambda: "an H200 (test)")
    monkeypatch.setattr(evaluate.KernelEvaluator, "compile",
                        lambda self, c: SimpleNamespace(ok=True, library=Path("lib.so"), diagnostics=""))
    monkeypatch.setattr(evaluate.KernelEvaluator, "verify", lambda self, c, lib: evaluate.Verdict(
        passed=self.task.spec.name == "swiglu", reason="" if self.task.spec.name == "swiglu" else "wrong-result",
        report="passed: 600 cases", record={"passed": True, "examples": 600}))
    monkeypatch.setattr(evaluate.KernelEvaluator, "measure", lambda self, c, lib: {"benchmark": None})
    assert main(["verify", "--locked", "--record", "--arch", "sm_90", str(locked_folder)]) == 1
    captured = capsys.readouterr()
    out = captured.out
    assert "recorded: verifier" in out and "FAILED cross_entropy" in out, captured.err
    lock = Lock.load(locked_folder)
    records = {op: lock.entry(op).records for op in ("swiglu", "cross_entropy")}
    assert [(r.gpu_arch, r.passed) for r in records["swiglu"]] == [("sm_90", True)]
    assert records["cross_entropy"] == []
    assert main(["verify", str(locked_folder / "swiglu.yaml"), "--record"]) == 2
