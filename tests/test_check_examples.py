"""`specgen check specs/` passes on every example spec and lists each one; `init` writes a passing spec."""
from __future__ import annotations

from specgen.cli import main
from specgen.spec import find_spec_files

from conftest import SPECS


def test_check_every_example_spec(capsys):
    files = find_spec_files([SPECS])
    assert len(files) >= 11
    assert main(["check", str(SPECS)]) == 0
    out = capsys.readouterr().out
    for path in files:
        assert path.stem in out.replace("\n", "").replace("│", "").replace(" ", "")


def test_init_writes_a_spec_that_checks_and_never_overwrites(tmp_path, capsys):
    assert main(["init", "my_op", "--dir", str(tmp_path)]) == 0
    path = tmp_path / "my_op.yaml"
    original = path.read_text()
    assert main(["check", str(path)]) == 0
    path.write_text(original + "# edited by the user\n")
    assert main(["init", "my_op", "--dir", str(tmp_path)]) == 2
    assert path.read_text().endswith("# edited by the user\n")
    assert "--force" in capsys.readouterr().err
