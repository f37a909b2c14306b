"""The GPU lock: a second holder waits until the first lets go, also across processes."""
import multiprocessing
import time

from specgen.verify.gpulock import exclusive_gpu, shared_gpu


def _hold(path, seconds, started, how="exclusive"):
    with (exclusive_gpu if how == "exclusive" else shared_gpu)(0, path=path):
        started.set()
        time.sleep(seconds)


def _holder(path, seconds, how):
    started = multiprocessing.get_context("fork").Event()
    process = multiprocessing.get_context("fork").Process(target=_hold, args=(path, seconds, started, how))
    process.start()
    assert started.wait(10)
    return process


def test_shared_holders_share_and_an_exclusive_one_waits_for_them(tmp_path):
    path = str(tmp_path / "gpu.lock")
    reader = _holder(path, 1.0, "shared")
    with shared_gpu(0, path=path) as waited:
        assert waited < 0.5  # two shared holders at once
    with exclusive_gpu(0, path=path) as waited:
        assert waited > 0.5  # the timing waits for the small cases to finish
    reader.join(10)


def test_a_waiting_exclusive_holder_is_not_starved_by_new_shared_ones(tmp_path):
    path = str(tmp_path / "gpu.lock")
    reader = _holder(path, 1.0, "shared")
    writer = multiprocessing.get_context("fork").Process(target=_hold, args=(path, 1.0,
                                                                             multiprocessing.Event()))
    writer.start()
    time.sleep(0.3)  # the writer now waits at the turnstile's far side, holding it
    started = time.perf_counter()
    with shared_gpu(0, path=path):
        # admitted only after the waiting writer had its turn (reader 1 s, then writer 1 s)
        assert time.perf_counter() - started > 1.2
    reader.join(10)
    writer.join(10)


def test_a_second_process_waits_for_the_first(tmp_path):
    path = str(tmp_path / "gpu.lock")
    started = multiprocessing.get_context("fork").Event()
    holder = multiprocessing.get_context("fork").Process(target=_hold, args=(path, 1.0, started))
    holder.start()
    assert started.wait(10)
    messages = []
    with exclusive_gpu(0, messages.append, path=path) as waited:
        assert waited > 0.5
    assert messages and "waiting for the GPU" in messages[0]
    holder.join(10)


def test_the_lock_is_free_after_the_block_and_after_an_error(tmp_path):
    path = str(tmp_path / "gpu.lock")
    try:
        with exclusive_gpu(0, path=path):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    with exclusive_gpu(0, path=path) as waited:
        assert waited < 0.5


def test_the_timed_phase_covers_every_shape_and_every_dtype_once():
    from specgen.verify.engine import timed_pairs

    pairs = timed_pairs(["big", "decode"], ["float32", "float16", "bfloat16"])
    assert {s for s, _ in pairs} == {"big", "decode"}
    assert {d for _, d in pairs} == {"float32", "float16", "bfloat16"}
    assert len(pairs) == 3
    assert timed_pairs([], ["float32"]) == []


def test_a_waiting_holder_gets_heartbeats(tmp_path, monkeypatch):
    from specgen.verify import gpulock

    monkeypatch.setattr(gpulock, "HEARTBEAT_S", 0.2)
    path = str(tmp_path / "gpu.lock")
    started = multiprocessing.get_context("fork").Event()
    holder = multiprocessing.get_context("fork").Process(target=_hold, args=(path, 1.0, started))
    holder.start()
    assert started.wait(10)
    beats = []
    with exclusive_gpu(0, path=path, waiting=beats.append):
        pass
    holder.join(10)
    assert len(beats) >= 3 and beats == sorted(beats) and beats[-1] > 0.5


def scripted_worker(next_message):
    """A VerifyWorker whose process is a stand-in and whose messages come from `next_message(timeout)`
    (None: nothing came within the timeout)."""
    from specgen.verify import worker as worker_module

    class Scripted(worker_module.VerifyWorker):
        def start(self):
            class Stdin:
                def write(self, data):
                    pass

                def flush(self):
                    pass

            self.process = type("P", (), {"stdin": Stdin(), "poll": lambda self: 0})()

        def kill(self):
            pass

        def _next_message(self, timeout):
            return next_message(timeout)

    return Scripted()


def test_the_worker_does_not_count_waiting_for_the_gpu_against_the_kernel(monkeypatch):
    """Scripted worker messages: 90 s of waiting (heartbeats) in a 60 s total budget still ends
    in the verdict, not a timeout."""
    from specgen.verify import worker as worker_module

    clock = [0.0]
    script = [{"type": "progress", "text": "forward: smoke"},
              {"type": "progress", "text": "waiting for the GPU: another verification is timing on it"}]
    script += [{"type": "waiting", "seconds": float(s)} for s in range(10, 100, 10)]
    script += [{"type": "progress", "text": "forward: timed calls"},
               {"type": "verdict", "verdict": {"reason": "passed", "detail": "ok"}}]

    def next_message(timeout):  # each message comes 10 s after the last
        if timeout < 10.0:
            clock[0] += timeout
            return None
        clock[0] += 10.0
        return script.pop(0) if script else None

    monkeypatch.setattr(worker_module.time, "monotonic", lambda: clock[0])
    verdict = scripted_worker(next_message).verify("spec.yaml", "lib.so", {}, idle_timeout=30, total_timeout=60)
    assert verdict.reason == "passed"


def test_a_timed_set_derives_its_truth_at_the_check_and_drops_it_after():
    """prepare(later=True) holds inputs only; checking derives the truth from the inputs as they
    are then (the staged copies) and gives it back; a wrong output is still caught."""
    import pytest
    import torch

    from conftest import SPECS
    from specgen.spec import load_spec
    from specgen.verify.checks import check_close
    from specgen.verify.data import prepare
    from specgen.verify.strategies import make_case
    from specgen.verify.verdict import Failure

    spec = load_spec(SPECS / "rmsnorm.yaml")
    for direction in ("forward", "backward"):
        case = make_case({"N": 6, "D": 40}, "float32", seed=3)
        eager = prepare(spec, case, direction, "cpu")
        lazy = prepare(spec, case, direction, "cpu", later=True)
        assert eager.truth and not lazy.truth and not lazy.reference
        lazy.inputs = {k: v.clone() for k, v in lazy.inputs.items()}  # as staging does: other storage
        right = {slot.name: eager.truth[slot.name].to(slot.dtype) for slot in eager.outputs}
        check_close(lazy, right)
        assert not lazy.truth and not lazy.reference  # dropped after the check
        wrong = {name: t.clone() for name, t in right.items()}
        first = next(iter(wrong))
        wrong[first].view(-1)[5] += 1.0
        with pytest.raises(Failure):
            check_close(lazy, wrong)
    assert torch.equal(eager.truth[first], prepare(spec, case, "backward", "cpu").truth[first])


def test_work_left_on_another_stream_shows_as_device_time_beyond_the_streams():
    from specgen.verify.timed import off_stream_work

    honest = off_stream_work([0.20, 0.21, 0.20], [0.23, 0.90, 0.24])  # one call descheduled: not a finding
    assert honest is None
    tiny = off_stream_work([0.004, 0.004], [0.030, 0.025])  # launch overhead of a tiny kernel
    assert tiny is None
    forked = off_stream_work([0.01, 0.012, 0.011], [0.25, 0.26, 0.24])  # the work ran elsewhere
    assert forked and "another stream" in forked
    assert off_stream_work([0.2], []) is None  # a runner that does not report walls


def test_the_total_limit_names_itself_and_the_idle_watch_names_itself(monkeypatch):
    """Two limits, two messages: a verification stopped by its total limit says that limit (it
    said the 60 s idle limit "in total" before), a silent one says the idle watch."""
    from specgen.verify import worker as worker_module

    def scripted(messages_every: float):
        clock = [0.0]

        def next_message(timeout):
            if timeout < messages_every:
                clock[0] += timeout
                return None
            clock[0] += messages_every
            return {"type": "progress", "text": "forward: a case"}

        monkeypatch.setattr(worker_module.time, "monotonic", lambda: clock[0])
        return scripted_worker(next_message)

    busy = scripted(10.0).verify("spec.yaml", "lib.so", {}, idle_timeout=30, total_timeout=100)
    assert busy.reason == "timeout" and "more than 100 s in total" in busy.detail
    silent = scripted(1000.0).verify("spec.yaml", "lib.so", {}, idle_timeout=30, total_timeout=100)
    assert silent.reason == "timeout" and "more than 30 s without progress" in silent.detail
