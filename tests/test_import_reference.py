"""`reference: pkg.module:name`: a reference imported by path works through check, the hash,
the builtin generator, the prompts and the packaged wheel's reference path."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from specgen import abi
from specgen.checking import check_spec
from specgen.cli import main
from specgen.reference_import import import_path, reference_code
from specgen.spec import load_spec

OPS = '''
import torch


def rms_ref(x, weight, eps=1e-6):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


class Scale(torch.nn.Module):
    def __init__(self, size):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(size))

    def forward(self, x):
        return x * self.weight


def get_init_inputs():
    return [16]
'''

SPEC = '''
name: rms
description: RMSNorm, the reference imported from a package.
signature: "rms(x: Tensor[N, D], weight: Tensor[D], eps: float = 1e-6) -> Tensor[N, D]"
dtypes: [float32, bfloat16]
dims: {N: [1, 64], D: [1, 64]}
reference: mypkg_sg.ops:rms_ref
backward: kernel
benchmark: [{N: 64, D: 64}]
'''


@pytest.fixture
def package(tmp_path, monkeypatch):
    root = tmp_path / "site"
    (root / "mypkg_sg").mkdir(parents=True)
    (root / "mypkg_sg" / "__init__.py").write_text("")
    (root / "mypkg_sg" / "ops.py").write_text(OPS)
    monkeypatch.syspath_prepend(str(root))
    for name in [m for m in sys.modules if m.startswith("mypkg_sg")]:
        monkeypatch.delitem(sys.modules, name)
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "rms.yaml").write_text(SPEC)
    return root, specs / "rms.yaml"


def test_import_paths_are_recognised():
    assert import_path("mypkg.ops:rms_ref") == ("mypkg.ops", "rms_ref")
    assert import_path("  mod:Cls.method \n") == ("mod", "Cls.method")
    assert import_path("def reference(x):\n    return x\n") is None
    assert import_path("mypkg.ops: rms_ref") is None


def test_check_runs_the_imported_function(package, capsys):
    _, spec_path = package
    assert main(["check", str(spec_path)]) == 0
    spec = load_spec(spec_path)
    x, w = torch.randn(3, 5), torch.randn(5)
    from mypkg_sg.ops import rms_ref
    assert torch.equal(spec.reference_fn()(x, w), rms_ref(x, w))
    assert "from mypkg_sg.ops import rms_ref as _sg_target" in reference_code(spec)


def test_the_spec_hash_covers_the_module_file(package):
    root, spec_path = package
    before = load_spec(spec_path).hash()
    assert load_spec(spec_path).hash() == before
    (root / "mypkg_sg" / "ops.py").write_text(OPS.replace("1e-6", "1e-5"))
    assert load_spec(spec_path).hash() != before  # the locked kernel goes stale


def test_a_module_that_cannot_be_imported_is_a_spec_error(tmp_path, capsys):
    path = tmp_path / "rms.yaml"
    path.write_text(SPEC.replace("mypkg_sg.ops:rms_ref", "nowhere_sg.ops:rms_ref"))
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert "cannot import the reference nowhere_sg.ops:rms_ref" in err and "PYTHONPATH" in err


def test_a_module_beside_the_spec_is_found(tmp_path):
    (tmp_path / "beside_sg.py").write_text(OPS)
    path = tmp_path / "scale.yaml"
    path.write_text(textwrap.dedent('''
        name: scale
        description: x times a learned scale (an nn.Module imported by path).
        signature: "scale(x: Tensor[N, D], weight: Tensor[D]) -> Tensor[N, D]"
        dtypes: [float32]
        dims: {N: [1, 32], D: [1, 32]}
        reference: beside_sg:Scale
    '''))
    result = check_spec(path)
    assert result.ok, result.error
    out = result.spec.reference_fn()(x=torch.ones(2, 3), weight=torch.full((3,), 4.0))
    assert torch.equal(out, torch.full((2, 3), 4.0))


def test_the_builtin_generator_and_the_prompt_read_the_imported_reference(package):
    from specgen.agents.base import KernelTask
    from specgen.agents.builtin import BuiltinAgent
    from specgen.agents.prompts import task_prompt

    spec = load_spec(package[1])
    task = KernelTask(spec=spec, header=abi.header_text(spec), header_name=abi.header_filename(spec))
    source = BuiltinAgent().propose(task, []).source
    assert "rms_forward" in source and "rms_backward" in source
    prompt = task_prompt(task)
    assert "def rms_ref(x, weight, eps=1e-6):" in prompt  # the model sees the real code


@pytest.mark.slow
def test_the_packaged_reference_imports_the_module_and_its_tests_pass(package, tmp_path):
    """The package (reference path, no compile) embeds the adapter, not the model code, and
    its generated CPU tests pass with the user's package installed."""
    from specgen.package import emit_package, package_model

    root, spec_path = package
    spec = load_spec(spec_path)
    tree = emit_package(package_model("sgimport", [spec], {}), tmp_path / "sgimport")
    embedded = (tree / "torch-ext" / "sgimport" / "_reference_rms.py").read_text()
    assert "from mypkg_sg.ops import rms_ref" in embedded and "rsqrt" not in embedded
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree / "torch-ext"), str(root)]))
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
                             "--pyargs", "sgimport.tests"], cwd=tmp_path, capture_output=True, text=True,
                            env=env, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]


def test_the_judge_and_the_sandbox_import_what_the_caller_can(tmp_path, monkeypatch):
    """`specgen verify` / `generate` / `build` start the judge (and `check` the sandbox) as child
    processes: a reference module reachable only through the caller's sys.path must be found
    there too."""
    from specgen.sandbox import callers_import_path
    from specgen.verify.worker import judge_environment

    only_here = tmp_path / "only_on_my_path"
    only_here.mkdir()
    monkeypatch.syspath_prepend(str(only_here))
    monkeypatch.setenv("PYTHONPATH", "/somewhere/else")
    parts = judge_environment()["PYTHONPATH"].split(os.pathsep)
    assert str(only_here) in parts and parts[-1] == "/somewhere/else"
    assert callers_import_path("/pkg", "").split(os.pathsep)[:2] == ["/pkg", str(only_here)]
