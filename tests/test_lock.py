"""The lock: states, atomic ordered writes, hand-edited kernels, records."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from specgen import lock as lockmod
from specgen.lock import FRESH, HAND_EDITED, MISSING, STALE, Lock, LockError, Record, kernel_hash
from specgen.spec import load_spec

SPECS = Path(__file__).resolve().parent.parent / "specs"
SOURCE = '#include "gelu_tanh_abi.h"\n/* v1 */\n'


@pytest.fixture
def spec_dir(tmp_path):
    shutil.copy(SPECS / "gelu_tanh.yaml", tmp_path / "gelu_tanh.yaml")
    return tmp_path


@pytest.fixture
def spec(spec_dir):
    return load_spec(spec_dir / "gelu_tanh.yaml")


def test_missing_then_fresh(spec, spec_dir):
    assert Lock.load(spec_dir).status(spec).state == MISSING
    path = lockmod.write_kernel(spec, SOURCE, agent="builtin")
    assert path == spec_dir / "kernels" / "gelu_tanh.cu"
    assert path.read_text() == SOURCE
    lock = Lock.load(spec_dir)
    assert lock.status(spec).state == FRESH
    entry = lock.entry("gelu_tanh")
    assert entry.kernel_hash == kernel_hash(SOURCE)
    assert entry.spec_hash == spec.hash()
    assert entry.spec == "gelu_tanh.yaml" and entry.kernel == "kernels/gelu_tanh.cu"


def test_lock_file_is_stable_sorted_json(spec, spec_dir):
    lockmod.write_kernel(spec, SOURCE, agent="builtin")
    text = (spec_dir / "specgen.lock").read_text()
    data = json.loads(text)
    assert data["version"] == 1
    assert text == json.dumps(data, indent=2, sort_keys=True) + "\n"


def test_stale_when_spec_changes(spec, spec_dir):
    lockmod.write_kernel(spec, SOURCE, agent="builtin")
    yaml = spec_dir / "gelu_tanh.yaml"
    yaml.write_text(yaml.read_text().replace("{N: 64, D: 4096}", "{N: 128, D: 4096}"))
    changed = load_spec(yaml)
    assert Lock.load(spec_dir).status(changed).state == STALE
    lockmod.write_kernel(changed, SOURCE, agent="builtin")  # a stale kernel may be regenerated
    assert Lock.load(spec_dir).status(changed).state == FRESH


def test_hand_edited_is_never_overwritten_without_regenerate(spec, spec_dir):
    path = lockmod.write_kernel(spec, SOURCE, agent="builtin")
    path.write_text(SOURCE + "// tuned by hand\n")
    status = Lock.load(spec_dir).status(spec)
    assert status.state == HAND_EDITED and "re-verify" in status.reason
    with pytest.raises(LockError, match="hand-edited"):
        lockmod.write_kernel(spec, "// new\n", agent="builtin")
    assert path.read_text() == SOURCE + "// tuned by hand\n"
    lockmod.write_kernel(spec, "// new\n", agent="builtin", regenerate=True)
    assert path.read_text() == "// new\n"
    assert Lock.load(spec_dir).status(spec).state == FRESH


def test_unlocked_kernel_file_counts_as_hand_edited(spec, spec_dir):
    (spec_dir / "kernels").mkdir()
    (spec_dir / "kernels" / "gelu_tanh.cu").write_text("// mine\n")
    assert Lock.load(spec_dir).status(spec).state == HAND_EDITED
    with pytest.raises(LockError):
        lockmod.write_kernel(spec, SOURCE, agent="builtin")


def test_crash_between_kernel_and_lock_leaves_previous_lock_valid(spec, spec_dir, monkeypatch):
    lockmod.write_kernel(spec, SOURCE, agent="builtin")
    before = (spec_dir / "specgen.lock").read_text()

    def crash():
        raise KeyboardInterrupt("power cut")

    lock = Lock.load(spec_dir)
    monkeypatch.setattr(lock, "_write_lock", crash)
    with pytest.raises(KeyboardInterrupt):
        lock.write_kernel(spec, "// v2\n", agent="builtin")
    assert (spec_dir / "specgen.lock").read_text() == before
    reloaded = Lock.load(spec_dir)  # still parses, still describes v1
    assert reloaded.entry("gelu_tanh").kernel_hash == kernel_hash(SOURCE)
    assert reloaded.status(spec).state == HAND_EDITED  # the unlocked v2 must be re-verified
    assert not list(spec_dir.glob(".*.tmp")) and not list((spec_dir / "kernels").glob(".*.tmp"))


def test_crash_inside_an_atomic_write_keeps_the_old_file(spec, spec_dir, monkeypatch):
    lockmod.write_kernel(spec, SOURCE, agent="builtin")
    before = (spec_dir / "kernels" / "gelu_tanh.cu").read_text()

    def failing_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr("specgen.fsutil.os.replace", failing_replace)
    with pytest.raises(OSError):
        lockmod.write_kernel(spec, "// v2\n", agent="builtin")
    assert (spec_dir / "kernels" / "gelu_tanh.cu").read_text() == before
    assert Lock.load(spec_dir).status(spec).state == FRESH


def _record(source: str, *, verified: bool = True, arch: str = "sm_90") -> Record:
    verification = {"passed": True, "examples": 10, "dtypes": ["float32"], "max_abs_error": 1e-7} if verified else None
    return Record(kernel_hash=kernel_hash(source), verifier_version="1", gpu_arch=arch,
                  verification=verification, benchmark={"rows": [{"N": 1, "us": 2.0}]})


def test_no_verification_record_without_gpu(spec, monkeypatch):
    monkeypatch.setattr(lockmod, "gpu_available", lambda: False)
    with pytest.raises(LockError, match="without a GPU"):
        lockmod.write_kernel(spec, SOURCE, agent="builtin", records=[_record(SOURCE)])
    lockmod.write_kernel(spec, SOURCE, agent="builtin")
    with pytest.raises(LockError, match="without a GPU"):
        lockmod.add_record(spec, _record(SOURCE))


def test_records_keyed_and_replaced(spec, spec_dir, monkeypatch):
    monkeypatch.setattr(lockmod, "gpu_available", lambda: True)
    lockmod.write_kernel(spec, SOURCE, agent="builtin", model=None, records=[_record(SOURCE)])
    lockmod.add_record(spec, _record(SOURCE, arch="sm_100"))
    lockmod.add_record(spec, _record(SOURCE))  # same key: replaces, does not duplicate
    entry = Lock.load(spec_dir).entry("gelu_tanh")
    assert sorted(r.gpu_arch for r in entry.records) == ["sm_100", "sm_90"]
    assert entry.verified_on("sm_90") and not entry.verified_on("sm_80")
    with pytest.raises(LockError, match="does not match"):
        lockmod.add_record(spec, _record("// other kernel\n"))
    # a new kernel drops the records of the old one
    lockmod.write_kernel(spec, "// v2\n", agent="builtin")
    assert Lock.load(spec_dir).entry("gelu_tanh").records == []


def test_entries_of_other_ops_survive(spec, spec_dir):
    shutil.copy(SPECS / "softmax.yaml", spec_dir / "softmax.yaml")
    other = load_spec(spec_dir / "softmax.yaml")
    stale_view = Lock.load(spec_dir)  # loaded before the other write
    lockmod.write_kernel(other, "// softmax\n", agent="builtin")
    stale_view.write_kernel(spec, SOURCE, agent="builtin")
    assert set(Lock.load(spec_dir).entries) == {"gelu_tanh", "softmax"}


def test_corrupt_lock_is_a_clear_error(spec, spec_dir):
    (spec_dir / "specgen.lock").write_text("{not json")
    with pytest.raises(LockError, match="not a valid specgen lock"):
        Lock.load(spec_dir)


def test_no_nvidia_device_means_no_gpu_without_importing_torch(monkeypatch, tmp_path):
    """On Linux with no NVIDIA device node or driver entry there is no GPU: gpu_available says so
    without importing torch (~4 s of every CPU-only build); with one, torch is asked."""
    import sys

    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(lockmod, "NVIDIA_DEVICE_PATHS", (str(tmp_path / "nvidiactl"),))
    monkeypatch.setitem(sys.modules, "torch", None)  # an import of torch would raise ImportError
    assert not lockmod.nvidia_device_present() and lockmod.gpu_available() is False
    (tmp_path / "nvidiactl").touch()
    assert lockmod.nvidia_device_present()
    assert lockmod.gpu_available() is False  # torch asked: here it cannot be imported, so no GPU either
    monkeypatch.setattr(sys, "platform", "win32")  # elsewhere torch is always asked
    (tmp_path / "nvidiactl").unlink()
    assert lockmod.nvidia_device_present()


def test_the_cli_parser_and_the_builtin_package_import_no_torch():
    """`specgen --help` and the parser of every command load without torch (the builtin agent's
    names load generator.py on first use)."""
    import subprocess
    import sys

    code = ("import sys; import specgen.cli as c; c.build_parser(); import specgen.agents.builtin.tune; "
            "assert 'torch' not in sys.modules, 'torch imported'; "
            "from specgen.agents.builtin import build_source; assert build_source.__module__.endswith('generator')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
