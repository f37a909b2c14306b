"""`specgen build`: the lock decides what is reused, generated or refused; the package says
what was verified. The wheel step is replaced by a stub here except in the nvcc tests, which
build real wheels, install them into a fresh folder and run their generated tests."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specgen import lock as lock_module
from specgen.cli import main
from specgen.lock import Lock, Record, kernel_hash
from specgen.spec import load_spec

from test_package import SWIGLU_CU

REPO = Path(__file__).resolve().parent.parent
SPECS = REPO / "specs"

BENCH_ROW = {"op": "swiglu", "dims": {"N": 4096, "H": 4096}, "dtype": "bfloat16", "bytes": 100663296,
             "roofline_us": 30.0, "copy_gbs": 3300.0, "kernel_us": 40.0, "eager_us": 80.0, "compile_us": 50.0,
             "speedup_vs_eager": 2.0, "speedup_vs_compile": 1.25, "kernel_roofline_fraction": 0.75}


@pytest.fixture
def folder(tmp_path):
    specs = tmp_path / "specs"
    specs.mkdir()
    for name in ("swiglu", "cross_entropy"):
        shutil.copy(SPECS / f"{name}.yaml", specs / f"{name}.yaml")
    return specs


def lock_swiglu(folder: Path, monkeypatch, *, verified: bool = True) -> None:
    spec = load_spec(folder / "swiglu.yaml")
    records = []
    if verified:
        monkeypatch.setattr(lock_module, "gpu_available", lambda: True)  # only a GPU writes records
        records = [Record(kernel_hash(SWIGLU_CU), "1", "sm_90",
                          verification={"passed": True, "cases": 64, "tolerances": {
                              "forward/bfloat16": {"spec_atol": 0.02, "spec_rtol": 0.02, "max_atol_used": 0.02}}},
                          benchmark={"op": "swiglu", "device": "NVIDIA H200", "copy_gbs": 3300.0, "rows": [BENCH_ROW]})]
    Lock.load(folder).write_kernel(spec, SWIGLU_CU, agent="hand", records=records)
    monkeypatch.setattr(lock_module, "gpu_available", lambda: False)


class RefusingAgent:
    name, model = "builtin", None

    def propose(self, task, history):
        from specgen.agents.base import AgentRefused

        raise AgentRefused(f"{task.spec.name}: outside the built-in generator's families")


@pytest.fixture
def stub_wheel(monkeypatch, tmp_path):
    """Replace the (slow) wheel build: record the tree, write an empty file as the wheel."""
    import specgen.package as package

    built = {}

    def fake_build_wheel(tree, out_dir, **kw):
        built["tree"] = Path(tree)
        built["files"] = {p.relative_to(tree).as_posix(): p.read_text() for p in Path(tree).rglob("*") if p.is_file()}
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        wheel = Path(out_dir) / "stub-0.1.0-py3-none-any.whl"
        wheel.write_text("")
        return wheel

    monkeypatch.setattr(package, "build_wheel", fake_build_wheel)
    monkeypatch.setattr("specgen.commands.build._create_agent", lambda args: RefusingAgent())
    return built


def build(*argv) -> int:
    return main(["build", *map(str, argv)])


def test_locked_fails_naming_each_op_that_is_not_fresh(folder, tmp_path, monkeypatch, stub_wheel, capsys):
    lock_swiglu(folder, monkeypatch)
    assert build(folder, "--locked", "-o", tmp_path / "dist") == 1
    err = capsys.readouterr().err
    assert "cross_entropy: missing" in err and "swiglu" not in err.split("--locked generates nothing")[1]
    assert "without --locked" in err and "specgen generate" in err
    assert "tree" not in stub_wheel  # nothing was packaged

    spec_file = folder / "swiglu.yaml"
    spec_file.write_text(spec_file.read_text().replace("SwiGLU gate:", "SwiGLU (changed) gate:", 1))
    assert build(folder / "swiglu.yaml", "--locked", "-o", tmp_path / "dist") == 1
    assert "swiglu: stale" in capsys.readouterr().err


def test_fresh_verified_kernel_is_reused_and_the_readme_shows_its_record(folder, tmp_path, monkeypatch, stub_wheel,
                                                                        capsys):
    lock_swiglu(folder, monkeypatch)
    before = (folder / "specgen.lock").read_bytes()
    assert build(folder / "swiglu.yaml", "--locked", "--name", "mykernels", "-o", tmp_path / "dist") == 0
    assert (folder / "specgen.lock").read_bytes() == before  # --locked writes nothing
    files = stub_wheel["files"]
    readme = files["README.md"]
    assert "verified on sm_90 (NVIDIA H200)" in readme and "64 cases" in readme
    assert "| N=4096, H=4096 | bfloat16 | 40.0 | 80.0 | 50.0 | 2.00x | 1.25x | 75% |" in readme
    assert files["kernels/swiglu/swiglu.cu"] == SWIGLU_CU
    assert "UNVERIFIED_OPS = []" in files["torch-ext/mykernels/_spec_data.py"]
    summary = capsys.readouterr().err
    assert "2.00x" in summary and "1.25x" in summary and "sm_90" in summary


def test_build_json_on_stdout_says_what_each_op_ships(folder, tmp_path, monkeypatch, stub_wheel, capsys):
    """`--json -`: the JSON alone on stdout (for CI), the human summary on stderr."""
    import json

    lock_swiglu(folder, monkeypatch)
    assert build(folder / "swiglu.yaml", "--locked", "-o", tmp_path / "dist", "--json", "-") == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert Path(data["wheel"]).name == "stub-0.1.0-py3-none-any.whl"
    (op,) = data["ops"]
    assert op["op"] == "swiglu" and op["verified_on"] == "sm_90 (NVIDIA H200)" and op["vs_eager"] == 2.0
    assert "swiglu" in captured.err  # the table went to stderr


def test_an_unverified_kernel_needs_no_verify_and_the_package_says_so(folder, tmp_path, monkeypatch, stub_wheel,
                                                                      capsys):
    lock_swiglu(folder, monkeypatch, verified=False)
    assert build(folder / "swiglu.yaml", "-o", tmp_path / "dist") == 1
    err = capsys.readouterr().err
    assert "no verification record" in err and "--no-verify" in err
    assert build(folder / "swiglu.yaml", "--no-verify", "-o", tmp_path / "dist") == 0
    files = stub_wheel["files"]
    assert "**Not verified on a GPU**" in files["README.md"]
    assert "UNVERIFIED_OPS = ['swiglu']" in files["torch-ext/specgen_kernels/_spec_data.py"]
    assert "'verified_on': None" in files["torch-ext/specgen_kernels/_spec_data.py"]


def test_a_refused_op_keeps_the_reference_path_is_locked_and_strict_refuses_it(folder, tmp_path, monkeypatch,
                                                                               stub_wheel, capsys):
    lock_swiglu(folder, monkeypatch)
    assert build(folder, "-o", tmp_path / "dist") == 0
    files = stub_wheel["files"]
    assert "kernels/cross_entropy/cross_entropy.cu" not in files
    assert "REFERENCE_OPS = ['cross_entropy']" in files["torch-ext/specgen_kernels/__init__.py"]
    assert "outside the built-in generator's families" in files["README.md"]
    # the refusal is in the lock, so CI's --locked build needs no agent
    monkeypatch.setattr("specgen.commands.build._create_agent", lambda args: pytest.fail("agent was run"))
    assert build(folder, "--locked", "-o", tmp_path / "dist") == 0
    assert build(folder, "--locked", "--strict", "-o", tmp_path / "dist") == 1
    assert "--strict" in capsys.readouterr().err


def test_a_hand_edited_kernel_is_never_overwritten_and_needs_a_gpu_to_be_verified(folder, tmp_path, monkeypatch,
                                                                                  stub_wheel, capsys):
    lock_swiglu(folder, monkeypatch)
    kernel = folder / "kernels" / "swiglu.cu"
    edited = SWIGLU_CU.replace("A simple SwiGLU kernel", "An edited SwiGLU kernel")
    kernel.write_text(edited)
    before = (folder / "specgen.lock").read_bytes()
    assert build(folder / "swiglu.yaml", "--locked", "-o", tmp_path / "dist") == 1
    assert "hand-edited" in capsys.readouterr().err
    assert build(folder / "swiglu.yaml", "-o", tmp_path / "dist") == 1  # no GPU here to verify it
    assert "no verification record" in capsys.readouterr().err
    assert build(folder / "swiglu.yaml", "--no-verify", "-o", tmp_path / "dist") == 0
    assert stub_wheel["files"]["kernels/swiglu/swiglu.cu"] == edited
    assert kernel.read_text() == edited and (folder / "specgen.lock").read_bytes() == before


def test_a_failed_packaging_step_leaves_the_lock_intact(folder, tmp_path, monkeypatch, stub_wheel):
    lock_swiglu(folder, monkeypatch)
    before = (folder / "specgen.lock").read_bytes()

    def interrupted(*args, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr("specgen.package.build_wheel", interrupted)
    assert build(folder, "-o", tmp_path / "dist") == 130
    lock_text = (folder / "specgen.lock").read_bytes()
    # the refusal of cross_entropy was recorded before packaging; swiglu's entry is untouched
    assert Lock.load(folder).entry("swiglu").kernel_hash == kernel_hash(SWIGLU_CU)
    assert before.decode().split('"swiglu"')[1][:400] == lock_text.decode().split('"swiglu"')[1][:400]


@pytest.mark.parametrize("argv, code, message", [
    (["--locked", "--regenerate"], 2, "contradict"),
    (["--name", "my-kernels"], 2, "lowercase identifier"),
    (["--arch-list", "sm_90"], 2, "not a CUDA capability"),
])
def test_usage_errors(folder, tmp_path, stub_wheel, capsys, argv, code, message):
    assert build(folder, "-o", tmp_path / "dist", *argv) == code
    assert message in capsys.readouterr().err


def test_missing_nvcc_is_an_environment_error(folder, tmp_path, monkeypatch, stub_wheel, capsys):
    from specgen.errors import EnvironmentMissing

    lock_swiglu(folder, monkeypatch)

    def no_toolkit():
        raise EnvironmentMissing("no CUDA toolkit: install it or set CUDA_HOME")

    monkeypatch.setattr("specgen.toolchain.find_cuda_toolkit", no_toolkit)
    assert build(folder / "swiglu.yaml", "-o", tmp_path / "dist") == 3
    assert "CUDA_HOME" in capsys.readouterr().err


def test_build_prints_timed_stage_lines_off_a_terminal(folder, tmp_path, stub_wheel, capsys):
    assert build(folder / "cross_entropy.yaml", "-o", tmp_path / "dist") == 0  # refused: the reference path
    err = capsys.readouterr().err
    for text in (r"cross_entropy: missing", r"writing the package tree of specgen_kernels \(1 ops\) \.\.\.",
                 r"building the wheel \.\.\."):
        assert re.search(r"^\[\s*\d+\.\ds\] " + text + "$", err, re.M), (text, err)


# what `python -m build` prints when torch's ninja build of the binding fails (torch 2.x, abridged)
FAILED_WHEEL_BUILD_LOG = """\
running bdist_wheel
running build_ext
Emitting ninja build file /t/build/temp.linux-x86_64-cpython-312/build.ninja...
[1/2] c++ -MMD -MF /t/build/temp/torch-ext/torch_binding.o.d -I/t/csrc -c /t/torch-ext/torch_binding.cpp -o /t/build/temp/torch-ext/torch_binding.o -O3
FAILED: /t/build/temp/torch-ext/torch_binding.o
c++ -MMD -MF /t/build/temp/torch-ext/torch_binding.o.d -I/t/csrc -c /t/torch-ext/torch_binding.cpp -o /t/build/temp/torch-ext/torch_binding.o -O3
/t/torch-ext/torch_binding.cpp: In function 'at::Tensor swiglu_forward(const at::Tensor&)':
/t/torch-ext/torch_binding.cpp:12:5: error: 'swiglu_launch' was not declared in this scope
   12 |     swiglu_launch(x.data_ptr(), n);
      |     ^~~~~~~~~~~~~
/t/torch-ext/torch_binding.cpp:20:9: warning: unused variable 'spare' [-Wunused-variable]
[2/2] /usr/local/cuda/bin/nvcc -c /t/kernels/swiglu/swiglu.cu -o /t/build/temp/kernels/swiglu/swiglu.o
ninja: build stopped: subcommand failed.
Traceback (most recent call last):
  File "/usr/lib/python3/dist-packages/torch/utils/cpp_extension.py", line 2595, in _run_ninja_build
    subprocess.run(
subprocess.CalledProcessError: Command '['ninja', '-v', '-j', '16']' returned non-zero exit status 1.
RuntimeError: Error compiling objects for extension

ERROR Backend subprocess exited when trying to invoke build_wheel
"""


def test_a_failed_wheel_build_names_the_step_its_errors_and_the_log(folder, tmp_path, monkeypatch, capsys):
    """The wheel build itself is replaced by a script that prints a failed compile and exits 1."""
    failing_builder = tmp_path / "failing_builder.py"
    failing_builder.write_text(f"import sys\nsys.stdout.write({FAILED_WHEEL_BUILD_LOG!r})\nsys.exit(1)\n")
    monkeypatch.setattr("specgen.package.wheel._build_command", lambda *a, **kw: [sys.executable, str(failing_builder)])
    monkeypatch.setattr("specgen.commands.build._create_agent", lambda args: RefusingAgent())
    assert build(folder / "cross_entropy.yaml", "-o", tmp_path / "dist") == 1
    err = capsys.readouterr().err
    assert "failed while compiling torch_binding.cpp:" in err
    assert "/t/torch-ext/torch_binding.cpp:12: error: 'swiglu_launch' was not declared in this scope" in err
    assert "swiglu_launch(x.data_ptr(), n);" in err  # the offending source line
    log = tmp_path / "dist" / "specgen_kernels.build.log"
    assert f"full log: {log}" in err and log.read_text() == FAILED_WHEEL_BUILD_LOG
    for cut in ("Traceback", "warning: unused variable", "[2/2]", "ERROR Backend"):  # not diagnostics of the error
        assert cut not in err, cut


# ---------------------------------------------------------------------------- real wheels

def install_and_test(wheel: Path, package: str, work: Path) -> subprocess.CompletedProcess:
    """pip --target into a fresh folder + PYTHONPATH (works where python is itself a venv), then
    the package's generated tests, run from a folder where no source tree shadows the install."""
    site = work / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site),
                    str(wheel)], check=True, capture_output=True)
    env = dict(os.environ, PYTHONPATH=str(site))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
                           "--pyargs", f"{package}.tests"], cwd=work, capture_output=True, text=True, env=env,
                          timeout=1200)


@pytest.mark.slow
@pytest.mark.nvcc
def test_a_locked_folder_builds_a_wheel_that_installs_and_passes_its_tests(folder, tmp_path, monkeypatch):
    lock_swiglu(folder, monkeypatch)
    monkeypatch.setattr("specgen.commands.build._create_agent", lambda args: RefusingAgent())
    # records cross_entropy's refusal; the same name as the build below, whose binding, shims and
    # kernel objects this build's object cache then holds (one compile of each, not two)
    assert build(folder, "--name", "sgbuild", "-o", tmp_path / "dist") == 0
    assert build(folder, "--locked", "--name", "sgbuild", "-o", tmp_path / "dist") == 0
    (wheel,) = (tmp_path / "dist").glob("sgbuild-*.whl")
    assert wheel.name.startswith("sgbuild-0.1.0-cp39-abi3-") and wheel.name.endswith("_x86_64.whl")  # manylinux_2_* via auditwheel
    result = install_and_test(wheel, "sgbuild", tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.nvcc
def test_the_example_specs_build_locked_into_a_wheel_that_passes_its_tests(tmp_path):
    """CI: `specgen build specs/ --locked` with the committed kernels and lock, as a user's CI
    would run it: the lock must be fresh and every kernel must carry a GPU verification record
    (no --no-verify), and the locked kernels must compile into a wheel whose tests pass."""
    assert (SPECS / "specgen.lock").exists(), "specs/specgen.lock must be committed"
    code = build(SPECS, "--locked", "--name", "specgen_kernels", "-o", tmp_path / "dist")
    assert code == 0
    (wheel,) = (tmp_path / "dist").glob("specgen_kernels-*.whl")
    result = install_and_test(wheel, "specgen_kernels", tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]


def test_the_symbol_gate_checks_kernels_at_once_and_reports_in_spec_order(monkeypatch):
    """The gate's checks run on a thread pool; what it refuses is listed in spec order, however
    the checks finish (the first kernel's check here ends last)."""
    import threading
    import types

    from rich.console import Console

    import specgen.package.gate as gate
    from specgen.commands.build import OpResult, _symbol_gate
    from specgen.errors import Rejected

    names = ["first", "second", "third"]
    running, most = [0], [0]
    lock = threading.Lock()
    last_done = threading.Event()

    def refusals(spec, source, arch=None):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        if spec.name == "first":
            last_done.wait(10)  # finishes after the others
        elif spec.name == names[-1]:
            last_done.set()
        with lock:
            running[0] -= 1
        return [f"calls {spec.name}_getenv"]

    monkeypatch.setattr(gate, "kernel_refusals", refusals)
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    results = [OpResult(types.SimpleNamespace(name=name), kernel="// cu") for name in names]
    results.insert(1, OpResult(types.SimpleNamespace(name="reference_only")))  # no kernel: not checked
    with pytest.raises(Rejected) as raised:
        _symbol_gate(results, types.SimpleNamespace(arch=None), Console(file=open(os.devnull, "w")), None)
    message = str(raised.value)
    assert [line.split(":")[0].strip(" -") for line in message.splitlines()[1:]] == names
    assert most[0] > 1  # at once


def test_the_symbol_gate_starts_when_the_link_does_and_its_answer_decides(folder, tmp_path, monkeypatch, stub_wheel,
                                                                          capsys):
    """The gate runs on a thread from the moment the wheel build links (beside its packing), once;
    a refusal keeps the wheel out of -o as before."""
    import threading

    import specgen.commands.build as build_command
    import specgen.package as package

    lock_swiglu(folder, monkeypatch)
    stub, gates = package.build_wheel, []

    def gate_problems(results, args, tree):
        gates.append(threading.current_thread() is not threading.main_thread())
        return ["swiglu: getenv: reads the environment"]

    def build_wheel(tree, out_dir, **kw):
        kw["on_link"]()
        kw["on_link"]()  # a second link line starts nothing more
        return stub(tree, out_dir, **kw)

    monkeypatch.setattr(build_command, "_gate_problems", gate_problems)
    monkeypatch.setattr(package, "build_wheel", build_wheel)
    assert build(folder / "swiglu.yaml", "-o", tmp_path / "dist") == 1
    err = capsys.readouterr().err
    assert "getenv: reads the environment" in err and "whatever its lock record says" in err, err
    assert gates == [True]  # on the thread, not again after the build
    assert not list((tmp_path / "dist").glob("*.whl"))
