"""The verifier's watchdogs on a loaded host: a request's watch grows by the time the kernel's
process waited for a CPU, the judge beats while it works, and a hang still ends. On the CPU:
starvation made by pinning busy processes to one CPU beside the one watched."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from specgen.verify import heartbeat
from specgen.verify.channel import Channel
from specgen.verify.cpu_wait import CpuWait
from specgen.verify.isolation import IsolatedRunner

SPIN = "import time\nwhile True: pass\n"
# answers on fd 3 once it has had `WORK_S` seconds of CPU (its own time, however long that takes)
ANSWER_AFTER_WORK = """
import json, os, socket, struct, sys, time
sock = socket.socket(fileno=int(sys.argv[1]))
work = float(sys.argv[2])
while time.process_time() < work:
    pass
body = json.dumps({"type": "done"}).encode()
sock.sendall(struct.pack("!I", len(body)) + body)
time.sleep(60)
"""


def _pinned(source: str, *args: str, cpu: int = 0, pass_fds=()) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", source, *args], pass_fds=pass_fds, start_new_session=True)
    os.sched_setaffinity(process.pid, {cpu})
    return process


@pytest.fixture
def crowd():
    """Three busy processes on CPU 0: anything else pinned there gets about a quarter of it."""
    spinners = [_pinned(SPIN) for _ in range(3)]
    yield
    for process in spinners:
        process.kill()
        process.wait()


def _stop(process: subprocess.Popen) -> None:
    process.kill()
    process.wait()


def test_cpu_wait_counts_a_starved_process_and_not_an_idle_one(crowd):
    starved = _pinned(SPIN)
    asleep = subprocess.Popen([sys.executable, "-c", "import time\nprint('asleep', flush=True)\ntime.sleep(60)\n"],
                              stdout=subprocess.PIPE, text=True)
    os.sched_setaffinity(asleep.pid, {0})
    try:
        assert asleep.stdout.readline().strip() == "asleep"  # its start, slow on a crowded CPU, is not the watch's
        waits = CpuWait(starved.pid), CpuWait(asleep.pid)
        time.sleep(1.5)
        starved_s, asleep_s = (wait.seconds() for wait in waits)
    finally:
        _stop(starved)
        _stop(asleep)
    assert starved_s > 0.6  # about 3/4 of 1.5 s runnable and not running
    assert asleep_s < 0.1  # a kernel hung in a blocking sync sleeps: no CPU wait to excuse it


def _runner_on(process: subprocess.Popen, ours: socket.socket) -> IsolatedRunner:
    """An IsolatedRunner's watch over `process` (the constructor starts a real candidate on a GPU;
    only the fields _receive reads are set)."""
    runner = object.__new__(IsolatedRunner)
    runner.process, runner.channel, runner.dead = process, Channel(ours), None
    return runner


def test_a_starved_kernel_process_is_waited_for_and_a_hung_one_still_times_out(crowd):
    ours, theirs = socket.socketpair()
    # 1 s of CPU on a CPU shared four ways: about 4 s of wall time, past a 2 s watch
    slow = _pinned(ANSWER_AFTER_WORK, str(theirs.fileno()), "1.0", pass_fds=(theirs.fileno(),))
    theirs.close()
    try:
        started = time.monotonic()
        reply = _runner_on(slow, ours)._receive(2.0)
        took = time.monotonic() - started
    finally:
        _stop(slow)
    assert reply == {"type": "done"}, reply
    assert took > 2.0  # the answer came after the wall-time watch alone would have stopped it

    ours, theirs = socket.socketpair()
    hung = _pinned("import time\ntime.sleep(600)\n", pass_fds=(theirs.fileno(),))  # keeps the channel open
    theirs.close()
    runner = _runner_on(hung, ours)
    started = time.monotonic()
    reply = runner._receive(1.0)
    assert reply == {"type": "timeout"} and time.monotonic() - started < 3.0
    assert runner.dead.startswith("no answer within 1 s") and hung.poll() is not None  # killed


def test_the_judge_beats_while_it_works_and_not_while_a_kernel_runs_here():
    beats = []
    heartbeat.every(0.1)
    stop = heartbeat.start(lambda: beats.append(time.monotonic()))
    try:
        time.sleep(0.6)
        working = len(beats)
        with heartbeat.kernel_running():
            time.sleep(0.6)
            in_kernel = len(beats) - working
    finally:
        stop.set()
        heartbeat.every(heartbeat.BEAT_S)
        heartbeat._send = None
    assert working >= 3
    assert in_kernel <= 1  # at most the beat already on its way when the call began
