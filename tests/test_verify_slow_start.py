"""A candidate's process that is slow to start (a busy machine) keeps telling the worker it is
alive, so the worker's watch for progress does not call the start a hung kernel. Found on the
H200: 13 verifications started side by side, 7 were "timeout: more than 60 s without progress
while running: starting". The process runs none of the candidate's code before it says ready."""
from __future__ import annotations

import os
import socket
import threading
import time
from types import SimpleNamespace

from specgen.verify import isolation
from specgen.verify.channel import Channel
from specgen.verify.isolation import IsolatedRunner


def starting_runner(ready_after: float):
    """An IsolatedRunner's waiting side over a socket whose other end says ready after a delay
    (the real one needs a GPU: it maps arenas at construction)."""
    ours, theirs = socket.socketpair()
    runner = object.__new__(IsolatedRunner)
    runner.channel, runner._ready, runner._startup_timeout, runner.dead = Channel(ours), False, 30.0, None
    runner.process = SimpleNamespace(pid=os.getpid())  # the process whose CPU waits extend the watch (cpu_wait.py)

    def start():
        time.sleep(ready_after)
        Channel(theirs).send({"type": "ready", "device": "stand-in"})

    threading.Thread(target=start, daemon=True).start()
    return runner, theirs


def test_a_slow_start_beats_while_it_waits_and_then_is_ready(monkeypatch):
    monkeypatch.setattr(isolation, "STARTUP_HEARTBEAT_S", 0.05)
    runner, _keep = starting_runner(ready_after=0.4)
    beats = []
    runner.wait_ready(heartbeat=beats.append)
    assert runner._ready
    assert len(beats) >= 3, beats  # about one per 0.05 s of the 0.4 s start
    assert beats == sorted(beats) and beats[-1] < 0.4 + 0.2


def test_a_quick_start_does_not_beat(monkeypatch):
    monkeypatch.setattr(isolation, "STARTUP_HEARTBEAT_S", 5.0)
    runner, _keep = starting_runner(ready_after=0.0)
    beats = []
    runner.wait_ready(heartbeat=beats.append)
    assert runner._ready and beats == []


def test_readable_sees_a_message_without_taking_it():
    ours, theirs = socket.socketpair()
    channel = Channel(ours)
    assert not channel.readable(0.01)
    Channel(theirs).send({"type": "ready"})
    assert channel.readable(1.0)
    assert channel.receive(1.0)[0] == {"type": "ready"}
