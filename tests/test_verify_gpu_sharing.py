"""The GPU lock: a second holder waits until the first lets go, also across processes."""
import multiprocessing
import time

from specgen.verify.gpulock import exclusive_gpu


def _hold(path, seconds, started):
    with exclusive_gpu(0, path=path):
        started.set()
        time.sleep(seconds)


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
