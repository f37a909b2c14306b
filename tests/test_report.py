"""`specgen report`: the committed lock as one self-contained HTML file with SVG charts, the
same data as JSON, extra `specgen bench` records and the lock's history in git (CPU only)."""
from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from conftest import SPECS
from specgen.cli import main


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "report.html"
    assert main(["report", str(SPECS), "-o", str(out), "--no-history"]) == 0
    return out.read_text()


def test_the_html_is_self_contained_with_inline_svg_charts(report):
    assert report.startswith("<!DOCTYPE html>")
    assert "<script" not in report and not re.search(r'(src|href)="https?://', report)
    assert report.count("<svg") >= 2 + 10  # speedups, roofline, and one per timed op
    ids = re.findall(r'id="([^"]+)"', report)
    assert len(ids) == len(set(ids))  # several SVGs in one page: no clashing ids


def test_every_op_with_its_timings_speedups_and_verification(report):
    for op in ("add_rmsnorm", "bias_gelu", "cross_entropy", "gelu_tanh", "layernorm_gelu", "linear_bias_relu",
               "log_softmax", "rmsnorm", "rope", "softmax", "swiglu"):
        assert f'id="op-{op}"' in report, op
    from specgen.lock import Lock
    from specgen.package.provenance import best_record

    record = best_record(Lock.load(SPECS).entries["rmsnorm"])  # the one the report shows
    row = record.benchmark["rows"][0]
    section = report[report.index('id="op-rmsnorm"'):report.index('id="op-rope"')]
    for value in (row["eager_us"], row["compile_us"], row["kernel_us"]):
        assert f"{value:,.1f}" in section
    assert f"{row['speedup_vs_compile']:.2f}×" in section and f"{row['kernel_roofline_fraction']:.0%}" in section
    assert "N=16384, D=8192" in section  # dims in the signature's order
    cases = record.verification.get("cases", record.verification.get("examples"))  # "examples" in older records
    assert f"{cases} cases" in section and "dtypes float32, float16, bfloat16" in section
    sanitized = record.verification.get("sanitized")
    said = "not recorded" if sanitized is None else "memcheck and racecheck clean" if sanitized else "not run"
    assert "forward bfloat16" in section and f"compute-sanitizer: {said}" in section
    assert "Roofline" in report and "copy roofline" in report
    assert "No kernel: CUDA runs the reference" in report  # linear_bias_relu


def test_json_on_stdout_carries_the_same_data(tmp_path, capsys):
    assert main(["report", str(SPECS), "-o", str(tmp_path / "r.html"), "--json", "-", "--no-history"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert "wrote" in captured.err and "specgen report" in captured.err
    ops = {op["op"]: op for op in data["ops"]}
    assert ops["softmax"]["verified"] and ops["softmax"]["verification"]["gpu_arch"] == "sm_90"
    assert ops["softmax"]["summary"]["forward"]["vs_compile"] > 1
    assert ops["linear_bias_relu"]["path"] == "reference"
    recorded = {r["benchmark"]["device"] for e in json.loads((SPECS / "specgen.lock").read_text())["ops"].values()
                for r in e.get("records", []) if r.get("benchmark")}
    assert data["totals"]["kernels"] == 10 and sorted(data["devices"]) == sorted(recorded) and len(recorded) >= 1
    html = (tmp_path / "r.html").read_text()
    assert f"{ops['softmax']['summary']['forward']['vs_compile']:.2f}×" in html


def test_whether_each_verification_was_sanitized_is_shown_and_in_the_json(tmp_path, capsys):
    folder = tmp_path / "specs"
    folder.mkdir()
    lock = json.loads((SPECS / "specgen.lock").read_text())
    lock["ops"] = {op: lock["ops"][op] for op in ("softmax", "rope")}
    for op, sanitized in (("softmax", True), ("rope", False)):
        shutil.copy(SPECS / f"{op}.yaml", folder)
        (folder / "kernels").mkdir(exist_ok=True)
        shutil.copy(SPECS / "kernels" / f"{op}.cu", folder / "kernels")
        for record in lock["ops"][op]["records"]:
            record["verification"]["sanitized"] = sanitized
    (folder / "specgen.lock").write_text(json.dumps(lock, indent=2))
    out = tmp_path / "r.html"
    assert main(["report", str(folder), "-o", str(out), "--json", "-", "--no-history"]) == 0
    ops = {op["op"]: op for op in json.loads(capsys.readouterr().out)["ops"]}
    assert ops["softmax"]["verified"] and ops["rope"]["verified"]
    assert ops["softmax"]["verification"]["sanitized"] is True
    assert ops["rope"]["verification"]["sanitized"] is False
    html = out.read_text()
    summary_row = {op: html[html.index(f'href="#op-{op}"'):].split("</tr>")[0] for op in ("softmax", "rope")}
    sanitized_cell = r'<td class="l" rowspan="\d+">{}</td>'
    assert re.search(sanitized_cell.format('<span class="ok">yes</span>'), summary_row["softmax"])
    assert re.search(sanitized_cell.format("no"), summary_row["rope"])
    section = {op: html[html.index(f'id="op-{op}"'):].split("</section>")[0] for op in ("softmax", "rope")}
    assert "compute-sanitizer: memcheck and racecheck clean" in section["softmax"]
    assert "compute-sanitizer: not run" in section["rope"]


def test_bench_records_join_their_op(tmp_path, capsys):
    record = {"op": "softmax", "device": "NVIDIA H200", "copy_gbs": 4000.0,
              "rows": [{"op": "softmax", "direction": "forward", "dims": {"N": 7, "D": 77}, "dtype": "float16",
                        "bytes": 2156, "eager_us": 20.0, "compile_us": 10.0, "kernel_us": 4.0,
                        "roofline_us": 0.5}]}
    (tmp_path / "bench.json").write_text(json.dumps(record))
    assert main(["report", str(SPECS), "-o", str(tmp_path / "r.html"), "--bench", str(tmp_path / "bench.json"),
                 "--json", "-", "--no-history"]) == 0
    ops = {op["op"]: op for op in json.loads(capsys.readouterr().out)["ops"]}
    extra = [r for r in ops["softmax"]["benchmark"]["rows"] if r["source"].endswith("bench.json")]
    assert extra[0]["speedup_vs_eager"] == 5.0 and extra[0]["kernel_roofline_fraction"] == 0.125
    assert extra[0]["baseline_us"] is None and extra[0]["speedup_vs_baseline"] is None


def test_a_baseline_kernel_timed_beside_the_kernel_is_shown(tmp_path, capsys):
    """`specgen bench --baseline OTHER.cu` times another kernel in the same run: the report keeps
    it (a column, a speedup and a bar), it does not drop it."""
    record = {"op": "softmax", "device": "NVIDIA H200", "copy_gbs": 4000.0,
              "rows": [{"op": "softmax", "direction": "forward", "dims": {"N": 7, "D": 77}, "dtype": "float16",
                        "bytes": 2156, "eager_us": 20.0, "compile_us": 10.0, "kernel_us": 4.0,
                        "baseline_us": 6.0, "roofline_us": 0.5}]}
    (tmp_path / "bench.json").write_text(json.dumps(record))
    html = tmp_path / "r.html"
    assert main(["report", str(SPECS), "-o", str(html), "--bench", str(tmp_path / "bench.json"),
                 "--json", "-", "--no-history"]) == 0
    ops = {op["op"]: op for op in json.loads(capsys.readouterr().out)["ops"]}
    extra = [r for r in ops["softmax"]["benchmark"]["rows"] if r["source"].endswith("bench.json")]
    assert extra[0]["baseline_us"] == 6.0 and extra[0]["speedup_vs_baseline"] == 1.5
    text = html.read_text()
    assert "<th>vs baseline</th>" in text and "1.50" in text
    assert "#2f9e44" in text  # the baseline's bars in the op's chart


def _git(folder, *args):
    subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"})


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_history_follows_the_lock_across_commits(tmp_path, capsys):
    specs = tmp_path / "repo" / "specs"
    specs.mkdir(parents=True)
    shutil.copy(SPECS / "softmax.yaml", specs)
    shutil.copytree(SPECS / "kernels", specs / "kernels")
    lock = json.loads((SPECS / "specgen.lock").read_text())
    lock["ops"] = {"softmax": lock["ops"]["softmax"]}
    slower = json.loads(json.dumps(lock))
    for record in slower["ops"]["softmax"]["records"]:  # every record: the report shows the best one
        for row in (record.get("benchmark") or {}).get("rows", []):
            row["speedup_vs_compile"] /= 2
    _git(tmp_path / "repo", "init", "-q")
    for version, message in ((slower, "first kernels"), (lock, "faster kernels")):
        (specs / "specgen.lock").write_text(json.dumps(version, indent=2))
        _git(tmp_path / "repo", "add", "-A")
        _git(tmp_path / "repo", "commit", "-q", "-m", message)
    assert main(["report", str(specs), "-o", str(tmp_path / "r.html"), "--json", "-"]) == 0
    history = json.loads(capsys.readouterr().out)["history"]
    assert [h["subject"] for h in history] == ["first kernels", "faster kernels"]
    first, second = (h["ops"]["softmax"]["forward"]["vs_compile"] for h in history)
    assert second == pytest.approx(first * 2)
    html = (tmp_path / "r.html").read_text()
    assert "History across lock updates" in html and "faster kernels" in html


def test_errors_and_a_missing_matplotlib(tmp_path, monkeypatch, capsys):
    assert main(["report", str(tmp_path), "-o", str(tmp_path / "r.html")]) == 2
    assert "no specgen.lock" in capsys.readouterr().err

    def no_matplotlib():
        from specgen.errors import EnvironmentMissing
        raise EnvironmentMissing("specgen report draws its charts with matplotlib, which is not installed; "
                                 "pip install 'specgen[report]'")

    monkeypatch.setattr("specgen.report.charts._pyplot", no_matplotlib)
    assert main(["report", str(SPECS), "-o", str(tmp_path / "r.html"), "--no-history"]) == 3
    assert "specgen[report]" in capsys.readouterr().err


def test_an_op_kept_on_the_reference_shows_the_timings_behind_the_decision(tmp_path):
    """The lock of `specgen import` + `specgen build` of examples/import/residual_silu_model.py on
    the H200 (session 6): the built-in kernel was verified but slower than eager on every row,
    so the package kept the reference; the report shows that kernel's time beside eager's."""
    folder = tmp_path / "specs"
    shutil.copytree(SPECS.parent / "tests" / "report_reference_kept", folder)
    out = tmp_path / "report.html"
    assert main(["report", str(folder), "-o", str(out), "--no-history"]) == 0
    html = out.read_text()
    assert "No kernel: CUDA runs the reference" in html and "slower than eager" in html
    assert "backward bfloat16 N=4096,D=4096" in html and "290.2" in html and "68.1" in html
    assert "0.23×" in html and "variant <code>default</code>, verified, on sm_90" in html
