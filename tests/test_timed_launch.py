"""A timed call times the kernel's device work, not the host's launch: the argument struct is
packed before the events, and the stream is kept busy while the host launches (on the H200 a
flat kernel of 37 us was timed at 106 us when the device sat idle at the start event)."""
from __future__ import annotations

import contextlib
import gc
import shutil
import subprocess
import types

import pytest
import torch

from conftest import SPECS
from specgen import abi
from specgen.spec import load_spec
from specgen.toolchain.cuda import find_cuda_toolkit
from specgen.verify import candidate_main
from specgen.verify.library import KernelLibrary

STUB = r"""
#include "gelu_tanh_abi.h"
cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t stream) {
  ((float*)a->out.data)[0] = (float)(a->N * 1000 + a->D);
  return (cudaError_t)7;
}
"""


@pytest.fixture
def stub_library(tmp_path):
    """A host-only stand-in for a kernel library: gelu_tanh's forward entry point in C."""
    try:
        include = find_cuda_toolkit().include_dir
    except Exception:  # noqa: BLE001 - no toolkit: nothing to compile against
        include = None
    if shutil.which("gcc") is None or include is None:
        pytest.skip("needs gcc and the CUDA headers")
    spec = load_spec(SPECS / "gelu_tanh.yaml")
    abi.write_header(spec, tmp_path)
    (tmp_path / "stub.c").write_text(STUB)
    library = tmp_path / "libstub.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(tmp_path / "stub.c"), f"-I{tmp_path}",
                    f"-I{include}"], check=True)
    return spec, library


def test_a_launcher_packs_once_and_keeps_its_struct_alive(stub_library):
    spec, path = stub_library
    library = KernelLibrary(spec, path)
    x, out = torch.zeros(3, 5), torch.zeros(3, 5)
    launch = library.launcher("forward", {"x": x, "out": out}, {}, {"N": 3, "D": 5},
                              types.SimpleNamespace(cuda_stream=0))
    gc.collect()  # the packed struct must outlive this: only the launcher holds it
    assert launch() == 7 and out[0, 0].item() == 3005.0
    out.zero_()
    assert launch() == 7 and out[0, 0].item() == 3005.0  # the same struct, called again
    assert library.call("forward", {"x": x, "out": out}, {}, {"N": 2, "D": 9},
                        types.SimpleNamespace(cuda_stream=0)) == 7 and out[0, 0].item() == 2009.0


class _Recorder:
    """A stand-in for the torch module `_timed` is given: it records the order of device work."""

    def __init__(self):
        self.log: list[str] = []
        recorder = self

        class Event:
            def __init__(self, enable_timing=False):
                self.name = f"event{len([e for e in recorder.log if e.startswith('record')])}"

            def record(self, stream=None):
                recorder.log.append("record")

            def elapsed_time(self, other):
                return 0.5

        self.cuda = types.SimpleNamespace(
            synchronize=lambda: self.log.append("sync"),
            _sleep=lambda cycles: self.log.append(f"sleep {cycles}"),
            Event=Event,
            stream=lambda stream: contextlib.nullcontext())


def test_timed_calls_pack_before_timing_and_cover_the_launch_with_device_work():
    fake = _Recorder()
    prepared = []

    def prepare_call(item, stream):
        fake.log.append(f"prepare {item['id']}")
        prepared.append(item["id"])
        return lambda: fake.log.append(f"launch {item['id']}") or 0

    message = {"calls": [{"id": 0}, {"id": 1}], "flush_bytes": 0}
    state = {"flush": None, "lib": None}
    reply = candidate_main._timed(fake, state, message, prepare_call, object(), tensors=None)
    assert reply["type"] == "timed" and reply["times_ms"] == [0.5, 0.5] and len(reply["walls_ms"]) == 2
    log = fake.log
    assert log.index("prepare 1") < log.index(f"sleep {candidate_main.LAUNCH_COVER_CYCLES}")  # packed first
    sleep = f"sleep {candidate_main.LAUNCH_COVER_CYCLES}"
    for call in (0, 1):
        at = log.index(f"launch {call}")
        # device idle -> the spin queued on the stream -> start event -> the launch alone -> end event
        assert log[at - 3: at + 2] == ["sync", sleep, "record", f"launch {call}", "record"], log
    assert candidate_main.LAUNCH_COVER_CYCLES >= 40_000  # about 20 us or more at 2 GHz
