"""Issue 14: a spec's reference is code. It runs in a sandboxed child (timeout, memory and CPU
limits, scratch folder, no secrets in its environment), and a reference that ends the
process, loops forever, mutates its input or returns a view of it gets a clear error
(cases 1, 5, 6 and 10 of the issue)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from specgen.checking import check_spec
from specgen.cli import main
from specgen.sandbox import Sandbox, scrubbed_env

REPO = Path(__file__).resolve().parent.parent

GOOD = """\
name: scale
description: Multiply by two.
signature: "scale(x: Tensor[N, D], alpha: float = 2.0) -> Tensor[N, D]"
dtypes: [float32, bfloat16]
dims: {N: [1, 64], D: [1, 64]}
reference: |
  import os, sys, time
  import torch

  def reference(x, alpha=2.0):
      return x * alpha
"""


def with_body(body: str, name: str = "scale") -> str:
    text = GOOD.replace("      return x * alpha\n", textwrap.indent(textwrap.dedent(body), "      "))
    return text.replace("name: scale", f"name: {name}").replace("scale(x", f"{name}(x")


def write(folder: Path, text: str, name: str = "scale.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    return path


def specgen(*argv: str, timeout: float = 240, env: dict | None = None) -> subprocess.CompletedProcess:
    """The CLI in a child process: a reference that ends the process must not end the test run."""
    full_env = dict(os.environ if env is None else env)
    full_env["PYTHONPATH"] = os.pathsep.join([str(REPO), full_env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "specgen.cli", *argv], capture_output=True, text=True,
                          timeout=timeout, env=full_env)


def no_traceback(result: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in result.stdout + result.stderr, result.stderr[-3000:]


# ---------------------------------------------------------------------------- case 1

@pytest.mark.parametrize("body, words", [
    ("sys.exit(0)\n", "sys.exit(0)"),
    ("raise SystemExit\n", "SystemExit"),
    ("exit()\n", "SystemExit"),
    ("os._exit(0)\n", "exit status 0"),
    ("os.kill(os.getpid(), 9)\n", "SIGKILL"),
])
def test_a_reference_that_ends_the_process_is_an_error_and_the_folder_is_still_checked(tmp_path, body, words):
    write(tmp_path, with_body(body), "a_exits.yaml")
    write(tmp_path, GOOD.replace("[float32, bfloat16]", "[float32, bfloat61]"), "b_broken.yaml")
    result = specgen("check", str(tmp_path))
    no_traceback(result)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "a_exits.yaml:" in result.stderr and words in result.stderr
    assert "b_broken.yaml:4" in result.stderr and "2 of 2 spec(s) failed" in result.stdout


def test_sys_exit_while_loading_the_reference(tmp_path):
    path = write(tmp_path, GOOD.replace("import os, sys, time\n", "import os, sys, time\n  sys.exit(3)\n"))
    error = check_spec(path).error
    assert error is not None and error.location.line == 8 and "sys.exit(3)" in error.message


# ---------------------------------------------------------------------------- case 5

def test_an_endless_reference_times_out_in_check(tmp_path):
    write(tmp_path, with_body("while True:\n    pass\n"))
    started = time.monotonic()
    result = specgen("check", str(tmp_path), env=dict(os.environ, SPECGEN_REFERENCE_TIMEOUT="3"))
    no_traceback(result)
    assert result.returncode == 2 and "did not finish within 3 s" in result.stderr
    assert time.monotonic() - started < 60


def test_an_endless_reference_stops_generate_before_any_agent_runs(tmp_path):
    specs = tmp_path / "specs"
    write(specs, with_body("time.sleep(3600)\n"))
    result = specgen("generate", str(specs), "--agent", "builtin", timeout=120,
                     env=dict(os.environ, SPECGEN_REFERENCE_TIMEOUT="3"))
    no_traceback(result)
    assert result.returncode == 2 and "did not finish within 3 s" in result.stderr
    assert not (specs / "kernels").exists()


def test_a_reference_that_eats_memory_is_stopped(tmp_path, monkeypatch):
    monkeypatch.setattr("specgen.checking.REFERENCE_MEMORY_MB", 512)
    path = write(tmp_path, with_body("hog = [bytearray(1 << 20) for _ in range(4096)]\nreturn x * alpha\n"))
    error = check_spec(path, sandbox=Sandbox()).error
    assert error is not None and "MemoryError" in error.message and error.location.line == 11


# ---------------------------------------------------------------------------- case 6

@pytest.mark.parametrize("body, words", [
    ("x.mul_(alpha)\nreturn x.clone()\n", "changed its input 'x' in place"),
    ("x.resize_(1)\nreturn torch.zeros(3)\n", "changed its input 'x' in place"),
    ("return x\n", "is its input 'x' or a view of it"),
    ("return x.view(x.shape)\n", "is its input 'x' or a view of it"),
])
def test_a_reference_that_mutates_or_aliases_its_input_is_refused(tmp_path, body, words):
    error = check_spec(write(tmp_path, with_body(body))).error
    assert error is not None and words in error.message, error
    assert error.field == "reference" and error.location.line == 7


# ---------------------------------------------------------------------------- case 10

def test_a_fixed_float32_output_names_the_float64_run(tmp_path):
    text = with_body("return (x * alpha).float()\n").replace("-> Tensor[N, D]", "-> Tensor[N, D] float32")
    error = check_spec(write(tmp_path, text)).error
    assert error is not None and "float64 run" in error.message and "verifier" in error.message
    assert "declared with a fixed dtype" in error.hint


# ---------------------------------------------------------------------------- the sandbox itself

def test_the_sandbox_environment_has_no_secrets_and_a_scratch_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_PROVIDER_API_KEY", "sk-leak")
    monkeypatch.setenv("GITHUB_TOKEN", "ghp-leak")
    monkeypatch.setenv("MY_SECRET_THING", "leak")
    monkeypatch.setenv("HARMLESS_SETTING", "kept")
    body = """\
    blob = open("/proc/self/environ", "rb").read()
    assert b"leak" not in blob and "leak" not in repr(dict(os.environ)), "a secret leaked"
    assert os.environ.get("HARMLESS_SETTING") == "kept"
    assert os.getcwd() != {cwd!r} and ".output" in os.listdir("."), os.listdir(".")
    open("scratch-file", "w").write("x")
    return x * alpha
    """.format(cwd=os.getcwd())
    sandbox = Sandbox()
    try:
        result = check_spec(write(tmp_path, with_body(body)), sandbox=sandbox)
    finally:
        sandbox.close()
    assert result.ok, result.error
    assert not list(Path(os.getcwd()).glob("scratch-file"))
    assert scrubbed_env({"A_API_KEY": "1", "B_TOKEN": "2", "X_SECRET": "3", "PATH": "/bin"}) == {"PATH": "/bin"}


def test_processes_a_reference_starts_are_killed_after_the_call(tmp_path, monkeypatch):
    pid_file = tmp_path / "pid"
    monkeypatch.setenv("SPECGEN_TEST_PID_FILE", str(pid_file))
    body = """\
    import subprocess
    child = subprocess.Popen(["sleep", "600"])
    open(os.environ["SPECGEN_TEST_PID_FILE"], "w").write(str(child.pid))
    return x * alpha
    """
    sandbox = Sandbox()
    try:
        assert check_spec(write(tmp_path / "s", with_body(body)), samples=1, sandbox=sandbox).ok
    finally:
        sandbox.close()
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead, only not reaped (its parent, the grandchild, is gone)
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_the_sandbox_dies_with_its_parent(tmp_path):
    code = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        from specgen.sandbox import Sandbox, Limits
        box = Sandbox()
        box._start()
        print(box._process.pid, box._scratch, flush=True)
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        line = parent.stdout.readline().split()
        child, scratch = int(line[0]), line[1]
        assert _alive(child) and Path(scratch).is_dir()
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (_alive(child) or Path(scratch).exists()):
        time.sleep(0.1)
    assert not _alive(child) and not Path(scratch).exists()


def test_check_rejects_zero_samples(capsys):
    with pytest.raises(SystemExit) as caught:
        main(["check", "--samples", "0", str(REPO / "specs")])
    assert caught.value.code == 2 and "must be at least 1" in capsys.readouterr().err


def test_a_sandbox_folder_left_by_a_killed_specgen_is_swept(tmp_path, monkeypatch):
    import tempfile

    dead = subprocess.Popen(["true"])
    dead.wait()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    stale = tmp_path / f"specgen-sandbox-{dead.pid}-abc123"
    stale.mkdir()
    (stale / ".sandbox.log").write_text("")
    live = tmp_path / f"specgen-sandbox-{os.getppid()}-def456"  # a specgen that is still running
    live.mkdir()
    sandbox = Sandbox()
    try:
        sandbox._start()
        assert Path(sandbox._scratch).parent == tmp_path and Path(sandbox._scratch).is_dir()
    finally:
        sandbox.close()
    assert not stale.exists() and live.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [live.name]
