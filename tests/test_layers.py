"""The package's layers and patch(model): the spec's `replaces:` field, a real transformers
Llama model patched on the CPU (the ops run their references there), the HF `kernels`
conventions (layer validation, build.toml parsed by kernels' own parser, a hub layout that
get_local_kernel loads) and reproducible pure-Python wheels. No compile: see
test_package_reproducible.py for the compiled wheel."""
from __future__ import annotations

import copy
import hashlib
import importlib.util
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch

from package_support import import_tree
from specgen.errors import SpecError, UsageError
from specgen.package import emit_package, package_model
from specgen.package.layer_runtime import call
from specgen.spec import load_spec

REPO = Path(__file__).resolve().parent.parent
SPECS = REPO / "specs"
OPS = ["rmsnorm", "gelu_tanh", "add_rmsnorm", "swiglu"]


def _specs(names=OPS):
    return [load_spec(SPECS / f"{n}.yaml") for n in names]


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    root = emit_package(package_model("sglayers", _specs(), {}), tmp_path_factory.mktemp("pkg") / "sglayers")
    return root, import_tree(root, "sglayers")


# ----- the spec field -------------------------------------------------------------------------

BASE = textwrap.dedent("""\
    name: rmsnorm
    description: RMSNorm.
    signature: "rmsnorm(x: Tensor[N, D], weight: Tensor[D], eps: float = 1e-6) -> Tensor[N, D]"
    dtypes: [float32]
    dims: {N: [1, 64], D: [1, 64]}
    reference: |
      def reference(x, weight, eps=1e-6):
          return x * weight
    """)


def _write(tmp_path, extra: str) -> Path:
    path = tmp_path / "rmsnorm.yaml"
    path.write_text(BASE + textwrap.dedent(extra))
    return path


def test_replaces_is_parsed_and_left_out_of_the_lock_hash(tmp_path):
    plain = load_spec(_write(tmp_path, ""))
    spec = load_spec(_write(tmp_path, """\
        replaces:
          layer: RMSNorm
          modules: [transformers.models.llama.modeling_llama.LlamaRMSNorm]
          args: {x: hidden_states, weight: self.weight, eps: self.variance_epsilon}
        """))
    (entry,) = spec.replaces
    assert entry.layer == "RMSNorm" and entry.forward_params == ["hidden_states"]
    assert spec.hash() == plain.hash()  # the layers never change the kernel or its verification
    listed = load_spec(_write(tmp_path, """\
        replaces:
          - {layer: A, modules: [m.A], args: {x: h, weight: self.w}}
          - {layer: B, modules: [m.B], forward: [h, unused], args: {x: h, weight: self.w, eps: self.e}}
        """))
    assert [r.layer for r in listed.replaces] == ["A", "B"] and listed.replaces[1].forward_params == ["h", "unused"]


@pytest.mark.parametrize("extra, line, words", [
    ("replaces:\n  layer: RMSNorm\n  modules: [LlamaRMSNorm]\n  args: {x: h, weight: self.w}\n", 11,
     "not a dotted class path"),
    ("replaces:\n  layer: RMSNorm\n  modules: [a.B]\n  args: {x: h, weight: self.w, y: self.y}\n", 12,
     "'y' is not a parameter of rmsnorm"),
    ("replaces:\n  layer: RMSNorm\n  modules: [a.B]\n  args: {x: h}\n", 12, "no source for the op parameter(s) weight"),
    ("replaces:\n  layer: RMSNorm\n  modules: [a.B]\n  forward: [a]\n  args: {x: h, weight: self.w}\n", 13,
     "'h' is not among forward's parameters"),
    ("replaces:\n  layer: 2bad\n  modules: [a.B]\n  args: {x: h, weight: self.w}\n", 10, "not a Python identifier"),
    ("replaces:\n  layer: R\n  modules: [a.B]\n  args: {x: h, weight: self..w}\n", 12, "not an attribute path"),
    ("replaces:\n  layer: R\n  modules: [a.B]\n  args: {x: h, weight: self.w}\n  returns: y\n", 13,
     "'y' is not an output of rmsnorm"),
    ("replaces:\n  layer: R\n  modules: [a.B]\n  args: {x: h, weight: self.w}\n  colour: red\n", 13, "colour"),
    ("replaces:\n  - {layer: R, modules: [a.B], args: {x: h, weight: self.w}}\n"
     "  - {layer: R, modules: [a.C], args: {x: h, weight: self.w}}\n", 11, "declared twice"),
])
def test_replaces_errors_name_the_yaml_line(tmp_path, extra, line, words):
    with pytest.raises(SpecError) as error:
        load_spec(_write(tmp_path, extra))
    text = str(error.value)
    assert f"rmsnorm.yaml:{line}:" in text and words in text, text
    assert "replaces" in text


def test_two_specs_cannot_declare_the_same_layer(tmp_path):
    a = load_spec(_write(tmp_path, "replaces: {layer: Norm, modules: [a.B], args: {x: h, weight: self.w}}\n"))
    b = a.model_copy(update={"name": "other"})
    with pytest.raises(UsageError, match="both declare replaces: layer: Norm"):
        package_model("sgdup", [a, b], {})


# ----- the layers at run time -----------------------------------------------------------------

def test_call_folds_leading_dims_and_restores_them(package):
    _, sg = package
    x, r, w = torch.randn(2, 3, 8), torch.randn(2, 3, 8), torch.randn(8)
    out = call(sg.add_rmsnorm, sg._spec_data.OPS["add_rmsnorm"], {"x": x, "residual": r, "weight": w})
    assert type(out).__name__ == "AddRmsnormResult" and out.out.shape == (2, 3, 8)
    flat = sg.add_rmsnorm(x.reshape(6, 8), r.reshape(6, 8), w)
    torch.testing.assert_close(out.residual_out, flat.residual_out.reshape(2, 3, 8))
    only = call(sg.add_rmsnorm, sg._spec_data.OPS["add_rmsnorm"], {"x": x, "residual": r, "weight": w},
                returns=[1], single=True)
    torch.testing.assert_close(only, x + r)
    with pytest.raises(ValueError, match="must agree"):
        call(sg.add_rmsnorm, sg._spec_data.OPS["add_rmsnorm"], {"x": x, "residual": r.reshape(3, 2, 8), "weight": w})
    swiglu = call(sg.swiglu, sg._spec_data.OPS["swiglu"], {"x": torch.randn(2, 5, 6)}, single=True)
    assert swiglu.shape == (2, 5, 3)


def test_layers_follow_the_kernels_hub_convention(package):
    pytest.importorskip("transformers")
    try:
        from kernels.layer.layer import _validate_layer
    except ImportError:  # kernels 0.19 moved it under _internals (the check itself unchanged)
        from kernels._internals.layer.layer import _validate_layer
    from transformers.activations import GELUTanh
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    _, sg = package
    assert set(sg.layers.__all__) == {"RMSNorm", "GeluTanh"}
    _validate_layer(check_cls=LlamaRMSNorm, cls=sg.layers.RMSNorm, repo="sglayers")  # raises on a violation
    _validate_layer(check_cls=GELUTanh, cls=sg.layers.GeluTanh, repo="sglayers")
    assert sg.layers.RMSNorm.has_backward and sg.layers.RMSNorm.can_torch_compile


class _Recorder(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self, namespace):
        super().__init__()
        self.namespace, self.seen = namespace, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == self.namespace:
            self.seen.append(func.__name__.split(".")[0])
        return func(*args, **(kwargs or {}))


def _llama(seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         hidden_act="gelu_pytorch_tanh")  # GELUTanh modules, so two layers are exercised
    return LlamaForCausalLM(config).float().eval()


def test_patched_llama_matches_the_unpatched_model_in_outputs_and_gradients(package):
    pytest.importorskip("transformers")
    _, sg = package
    model = _llama()
    patched = copy.deepcopy(model)
    keys = list(patched.state_dict())
    names = sg.patch(patched)
    assert sorted(names) == sorted(
        [f"model.layers.{i}.{m}" for i in range(2) for m in ("input_layernorm", "post_attention_layernorm",
                                                              "mlp.act_fn")] + ["model.norm"])
    assert sg.patch(patched) == names  # patching twice changes nothing
    assert list(patched.state_dict()) == keys and sg.layers.patched(patched)["model.norm"] == "RMSNorm"

    ids = torch.randint(0, 96, (2, 7))
    expected = model(ids, labels=ids)
    with _Recorder(sg.NAMESPACE) as recorder:
        got = patched(ids, labels=ids)
    # the ops ran (rmsnorm saves its rstd for the backward: under autograd its forward is rmsnorm_fwd_saved)
    assert recorder.seen.count("rmsnorm") + recorder.seen.count("rmsnorm_fwd_saved") == 5
    # gelu_tanh takes `*N`: its public op is a composite over gelu_tanh_rows, which the dispatch mode sees
    assert recorder.seen.count("gelu_tanh") + recorder.seen.count("gelu_tanh_rows") == 2
    torch.testing.assert_close(got.logits, expected.logits, rtol=1e-5, atol=1e-5)
    expected.loss.backward()
    got.loss.backward()
    for (name, a), b in zip(model.named_parameters(), patched.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-6, msg=name)

    assert sorted(sg.unpatch(patched)) == sorted(names) and sg.layers.patched(patched) == {}
    with _Recorder(sg.NAMESPACE) as recorder:
        patched(ids)
    assert recorder.seen == []


def test_patch_checks_the_modules_and_the_layer_names(package):
    pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    _, sg = package
    model = torch.nn.Sequential(LlamaRMSNorm(8), LlamaRMSNorm(8))
    del model[1].variance_epsilon
    with pytest.raises(ValueError, match=r"module '1' \(LlamaRMSNorm\) has no variance_epsilon"):
        sg.patch(model)
    assert sg.layers.patched(model) == {}  # nothing changed before the error
    with pytest.raises(ValueError, match="no layer Nope"):
        sg.patch(model, layers=["Nope"])

    class MyNorm(LlamaRMSNorm):  # a subclass of a replaced class is replaced too
        pass

    assert sg.patch(torch.nn.Sequential(MyNorm(8)), layers="RMSNorm") == ["0"]


# ----- namespaces, the hub layout and the wheel ------------------------------------------------

def test_namespaces_are_unique_per_build_and_a_build_loads_twice(tmp_path, package):
    _, sg = package
    other = emit_package(package_model("sglayers", _specs(), {}, version="0.2.0"), tmp_path / "v2" / "sglayers")
    v2 = import_tree(other, "sglayers", "sglayers_v2")
    assert v2.NAMESPACE != sg.NAMESPACE and v2.NAMESPACE.startswith("sglayers_")
    x, w = torch.randn(3, 8), torch.randn(8)
    torch.testing.assert_close(v2.rmsnorm(x, w), sg.rmsnorm(x, w))
    root, _ = package
    again = import_tree(root, "sglayers", "_sglayers_copy")  # what the kernels loader does
    assert again.ops is sg.ops or again.NAMESPACE == sg.NAMESPACE
    torch.testing.assert_close(again.rmsnorm(x, w), sg.rmsnorm(x, w))


def test_build_toml_is_accepted_by_the_kernels_parser(tmp_path):
    rust = pytest.importorskip("kernels._rust")
    pkg = package_model("sg_hub_kernels", _specs(["swiglu", "rmsnorm"]),
                        {"swiglu": "// kernel", "rmsnorm": "// kernel"}, arch_list="8.0;9.0+PTX")
    root = emit_package(pkg, tmp_path / "tree")
    build = rust.Build.open(root)  # raises ValueError on a schema violation
    assert [str(b) for b in build.general.backends] == ["cuda"]
    assert 'name = "sg-hub-kernels"' in (root / "build.toml").read_text()
    with pytest.raises(ValueError):  # the parser is strict: the old layout is refused
        (root / "build.toml").write_text((root / "build.toml").read_text().replace("edition = 5", "universal = false"))
        rust.Build.open(root)


def _build(tree: Path, out: Path) -> tuple[Path, Path]:
    from specgen.package import build_wheel

    wheel = build_wheel(tree, out, needs_cuda=False, sdist=True)
    return wheel, next(out.glob("*.tar.gz"))


@pytest.mark.slow
def test_pure_wheels_are_reproducible_and_load_as_a_hub_kernel(tmp_path):
    """Two builds of the same specs from different folders: the same bytes. The wheel carries
    the license, types and layers; its hub layout loads with kernels.get_local_kernel."""
    pytest.importorskip("kernels")
    from specgen.package import write_hub_layout

    pkg = package_model("sgrepro", _specs(), {})
    first = _build(emit_package(pkg, tmp_path / "a" / "sgrepro"), tmp_path / "dist_a")
    second = _build(emit_package(pkg, tmp_path / "elsewhere" / "b" / "sgrepro"), tmp_path / "dist_b")
    digest = [[hashlib.sha256(p.read_bytes()).hexdigest() for p in pair] for pair in (first, second)]
    assert digest[0] == digest[1]
    names = zipfile.ZipFile(first[0]).namelist()
    for member in ("sgrepro/py.typed", "sgrepro/__init__.pyi", "sgrepro/layers.py", "sgrepro/_patching.py",
                   "sgrepro-0.1.0.dist-info/licenses/LICENSE"):
        assert member in names
    package_files = [n for n in names if ".dist-info/" not in n]
    assert package_files == sorted(package_files) and names[-1].endswith("RECORD")

    write_hub_layout(pkg, first[0], tmp_path / "hub", "13.0")
    probe = ("import sys, pathlib, torch, kernels\n"
             "k = kernels.get_local_kernel(pathlib.Path(sys.argv[1]))\n"
             "x, w = torch.randn(2, 3, 8), torch.randn(8)\n"
             "norm = torch.nn.Module(); norm.weight = torch.nn.Parameter(w); norm.variance_epsilon = 1e-6\n"
             "y = k.layers.RMSNorm.forward(norm, x)\n"
             "print(k.NAMESPACE, torch.allclose(y, k.rmsnorm(x.reshape(6, 8), w).reshape(2, 3, 8)))\n")
    result = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "hub")], capture_output=True, text=True,
                            cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == [pkg.namespace, "True"]

    # kernels' own kernelize swaps the hub layer into a transformers model (transformers'
    # integration does the same when its kernels version matches)
    pytest.importorskip("transformers")
    kernelize = textwrap.dedent("""\
        import copy, sys, torch
        from pathlib import Path
        from kernels import LocalLayerRepository, Mode, kernelize, use_kernel_mapping, replace_kernel_forward_from_hub
        from transformers import LlamaConfig, LlamaForCausalLM
        from transformers.models.llama.modeling_llama import LlamaRMSNorm
        replace_kernel_forward_from_hub(LlamaRMSNorm, "RMSNorm")
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                                             num_attention_heads=4, num_key_value_heads=2)).eval()
        hub = copy.deepcopy(model)
        with use_kernel_mapping({"RMSNorm": {"cpu": LocalLayerRepository(Path(sys.argv[1]), layer_name="RMSNorm")}}):
            hub = kernelize(hub, mode=Mode.INFERENCE, device="cpu")
        ids = torch.randint(0, 96, (2, 5))
        print(hub.model.norm.forward.__func__.__module__.endswith(".layers"),
              torch.allclose(hub(ids).logits, model(ids).logits, atol=1e-6))
        """)
    result = subprocess.run([sys.executable, "-c", kernelize, str(tmp_path / "hub")], capture_output=True, text=True,
                            cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-2:] == ["True", "True"]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_installed_package_patches_llama_on_the_gpu(dtype):
    """The built wheel's kernels in a real model: scripts/gpu_stages/model_patch.sh installs it
    (SPECGEN_PATCH_PACKAGE names it; default specgen_kernels)."""
    pytest.importorskip("transformers")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    try:
        sg = importlib.import_module(os.environ.get("SPECGEN_PATCH_PACKAGE", "specgen_kernels"))
    except ImportError:
        pytest.skip("no built package installed (scripts/gpu_stages/model_patch.sh installs one)")
    model = _llama().to(device="cuda", dtype=getattr(torch, dtype)).train()
    patched = copy.deepcopy(model)
    assert sg.patch(patched)
    ids = torch.randint(0, 96, (2, 33), device="cuda")
    expected, got = model(ids, labels=ids), patched(ids, labels=ids)
    tol = {"float32": 1e-4, "bfloat16": 5e-2}[dtype]
    torch.testing.assert_close(got.logits, expected.logits, rtol=tol, atol=tol)
    expected.loss.backward()
    got.loss.backward()
    for (name, a), b in zip(model.named_parameters(), patched.parameters()):
        error = ((b.grad.float() - a.grad.float()).norm() / a.grad.float().norm().clamp_min(1e-12)).item()
        assert error < {"float32": 1e-3, "bfloat16": 5e-2}[dtype], (name, error)  # relative, per parameter


def test_build_progress_names_each_compile_step_as_it_finishes():
    from specgen.package.wheel import _CompileSteps

    heard, now = [], iter([110.0, 110.0, 131.0, 131.0, 174.4, 174.4])  # the extension started, two steps done
    on_line = _CompileSteps(heard.append, clock=lambda: next(now), on_link=lambda: heard.append("(objects done)"))
    for line in ["running build_ext",
                 "building 'sg._C' extension",
                 "[1/3] /usr/local/cuda/bin/nvcc --generate-dependencies-with-compile --dependency-output "
                 "/t/build/temp/kernels/swiglu/swiglu.o.d -I/t/kernels/swiglu -c /t/kernels/swiglu/swiglu.cu "
                 "-o /t/build/temp/kernels/swiglu/swiglu.o -include /t/torch-ext/glibc_compat.h",
                 "[2/3] c++ -MMD -MF /t/b/torch_binding.o.d -c /t/torch-ext/torch_binding.cpp -o /t/b/torch_binding.o",
                 "g++ -shared /t/b/torch_binding.o /t/b/swiglu.o -o build/lib/sg/_C.abi3.so"]:
        on_line(line)
    # ninja prints a step's line when it ends (its output is piped): "compiled", timed from the start
    assert heard == ["compiling the extension (a line as each object is done)", "compiled 1/3: swiglu.cu (21 s)",
                     "compiled 2/3: torch_binding.cpp (64 s)", "linking the extension", "(objects done)"]


def test_build_progress_fills_a_long_compile_with_a_line_every_30_s():
    from specgen.package.wheel import _CompileSteps

    heard, now = [], [0.0]
    on_line = _CompileSteps(heard.append, clock=lambda: now[0])
    on_line.heartbeat()
    assert heard == []  # before the compiles: nothing to say
    on_line("building 'sg._C' extension")
    for second in (10, 29, 31, 45, 62):
        now[0] = second
        on_line.heartbeat()
    on_line("[1/3] c++ -MMD -MF /t/b/torch_binding.o.d -c /t/torch-ext/torch_binding.cpp -o /t/b/torch_binding.o")
    now[0] = 80
    on_line.heartbeat()  # 18 s after the last line: quiet enough
    now[0] = 93
    on_line.heartbeat()
    on_line("g++ -shared /t/b/torch_binding.o -o build/lib/sg/_C.abi3.so")
    now[0] = 200
    on_line.heartbeat()  # linked: the compiles are over
    assert heard == ["compiling the extension (a line as each object is done)", "still compiling: none yet done (31 s)",
                     "still compiling: none yet done (62 s)", "compiled 1/3: torch_binding.cpp (62 s)",
                     "still compiling: 1/3 done (93 s)", "linking the extension"]


def test_object_cache_reuses_objects_by_content_across_trees(tmp_path, monkeypatch):
    """The wheel build's compiler launcher (no real compiler: a fake that counts its runs)."""
    from specgen.package.objcache import parse_depfile, run

    fake = tmp_path / "fakecc.py"
    fake.write_text(textwrap.dedent("""\
        import sys, pathlib
        args = sys.argv[1:]
        last_c = len(args) - 1 - args[::-1].index("-c")  # torch's rule repeats -c: `$cflags -c $in`
        src, out, dep = args[last_c + 1], args[args.index("-o") + 1], args[args.index("-MF") + 1]
        header = pathlib.Path(src).with_name("h.h")
        pathlib.Path(out).write_text("object of " + pathlib.Path(src).read_text() + header.read_text())
        pathlib.Path(dep).write_text(f"{out}: {src} \\\\\\n  {header}\\n")
        with open(sys.argv[0] + ".runs", "a") as runs:
            runs.write("run\\n")
        """))
    wrapper = tmp_path / "cc"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {fake} \"$@\"\n")
    wrapper.chmod(0o755)
    monkeypatch.setenv("SPECGEN_OBJECT_CACHE", str(tmp_path / "cache"))

    def compile_in(tree: Path, header="v1") -> str:
        (tree / "b").mkdir(parents=True, exist_ok=True)
        (tree / "k.cu").write_text("kernel")
        (tree / "h.h").write_text(header)
        monkeypatch.setenv("SPECGEN_TREE", str(tree))
        args = ["-O3", f"-ffile-prefix-map={tree}=.", "-MF", str(tree / "b/k.o.d"), "-c", "-c", str(tree / "k.cu"),
                "-o", str(tree / "b/k.o")]
        assert run(str(wrapper), args) == 0
        assert parse_depfile((tree / "b/k.o.d").read_text()) == [str(tree / "k.cu"), str(tree / "h.h")]
        return (tree / "b/k.o").read_text()

    runs = Path(str(fake) + ".runs")
    assert compile_in(tmp_path / "one") == "object of kernelv1"
    assert compile_in(tmp_path / "two" / "deeper") == "object of kernelv1"  # another tree: reused
    assert runs.read_text().count("run") == 1
    assert compile_in(tmp_path / "three", header="v2") == "object of kernelv2"  # a header changed: compiled
    assert runs.read_text().count("run") == 2
