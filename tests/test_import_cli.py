"""`specgen import`: writes a checked spec atomically, never over a file without --force, JSON on stdout."""
from __future__ import annotations

import json
import shutil

from conftest import REPO
from specgen.cli import main

EXAMPLE = REPO / "examples" / "import" / "rmsnorm_model.py"


def test_import_writes_a_checked_spec_and_lists_what_to_confirm(tmp_path, capsys):
    assert main(["import", str(EXAMPLE), "-o", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    path = tmp_path / "rmsnorm_model.yaml"
    assert f"wrote {path}" in out.replace("\n", "") and "confirm (" in out
    text = path.read_text()
    assert text.startswith("# Written by `specgen import`") and "#   - D: x.shape[1] and weight.shape[0]" in text
    assert main(["check", str(path)]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["rmsnorm_model.yaml"]  # no temporary file left


def test_import_never_overwrites_without_force(tmp_path, capsys):
    path = tmp_path / "mine.yaml"
    path.write_text("# the user's own spec\n")
    assert main(["import", str(EXAMPLE), "-o", str(path)]) == 2
    assert "--force" in capsys.readouterr().err
    assert path.read_text() == "# the user's own spec\n"
    assert main(["import", str(EXAMPLE), "-o", str(path), "--force", "--name", "mine"]) == 0
    assert "name: mine" in path.read_text()


def test_import_json_goes_alone_on_stdout(tmp_path, capsys):
    assert main(["import", str(EXAMPLE), "-o", str(tmp_path), "--json", "-"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data["signature"] == "rmsnorm_model(x: Tensor[N, D], weight: Tensor[D]) -> Tensor[N, D]"
    assert data["reference_mode"] == "inline" and data["flags"] and data["path"].endswith("rmsnorm_model.yaml")
    assert "wrote" in captured.err


def test_import_by_path_keeps_the_model_out_of_the_spec(tmp_path, capsys):
    shutil.copy(EXAMPLE, tmp_path / "rmsnorm_model.py")
    assert main(["import", str(tmp_path / "rmsnorm_model.py"), "--reference", "import", "-o", str(tmp_path)]) == 0
    text = (tmp_path / "rmsnorm_model.yaml").read_text()
    assert "reference: rmsnorm_model:Model" in text and "class Model" not in text


def test_import_usage_errors(tmp_path, capsys):
    assert main(["import", str(tmp_path / "missing.py")]) == 2
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "no_inputs.py").write_text("def f(x):\n    return x\n")
    assert main(["import", f"{tmp_path / 'no_inputs.py'}:f", "-o", str(tmp_path)]) == 2
    assert "get_inputs" in capsys.readouterr().err
    (tmp_path / "flat.py").write_text("import torch\ndef f(x):\n    return x.reshape(-1)\n"
                                      "def get_inputs():\n    return [torch.randn(3, 4)]\n")
    assert main(["import", f"{tmp_path / 'flat.py'}:f", "-o", str(tmp_path)]) == 1
    assert "several symbols" in capsys.readouterr().err


def test_a_package_function_is_referenced_by_import_path(tmp_path, monkeypatch, capsys):
    package = tmp_path / "site" / "sgpkg_cli"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "ops.py").write_text("import torch\n\n\ndef bias_relu(x, bias):\n    return torch.relu(x + bias)\n\n\n"
                                    "def get_inputs():\n    return [torch.randn(64, 48), torch.randn(48)]\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    out = tmp_path / "specs"
    assert main(["import", "sgpkg_cli.ops:bias_relu", "-o", str(out), "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["reference_mode"] == "import"
    text = (out / "bias_relu.yaml").read_text()
    assert "reference: sgpkg_cli.ops:bias_relu" in text and "torch.relu" not in text
    assert main(["check", str(out)]) == 0
