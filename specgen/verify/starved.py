"""A call on a GPU with no memory left to allocate (verifier version 12).

A kernel written before the ABI's workspace may take scratch with cudaMallocAsync on `stream`. On a
nearly full GPU (training tuned to the memory limit, the backward at the peak of activation memory)
that allocation fails; a kernel that launches with the null pointer then faults and kills the CUDA
context, where torch raises a catchable OutOfMemoryError (Hugging Face's `auto_find_batch_size`
retries with a smaller batch). The verifier's GPU always has room, so one call per direction runs
with the device's memory pool full and unable to grow (pool.StarvedPool): the kernel may return an
error code (it saw the failure) or compute the right outputs without allocating; it may not crash,
write outside its outputs, or return success with wrong outputs. Held-out attacks-v9's bias_gelu
backward used its failed allocation unchecked and passed version 11 (session 34).

Since version 16 (the section below) the call runs at the widest row and with many rows too, and
normal calls follow each one: a process goes on after an allocation failed.
"""
from __future__ import annotations

from .. import abi
from .checks import check_close
from .data import CaseData, stage
from .runner import check_guards, fill_outputs, raise_if_faulted, raise_outcome, synchronize

HINT = ("check what every cudaMallocAsync returns and return its error (cudaErrorMemoryAllocation) before "
        "launching anything that uses the memory, or take scratch from the workspace the ABI hands each call")


def check_allocation_failure(runner, data: CaseData) -> str | None:
    """`data` (staged) called once with every stream-ordered allocation failing. None when checked;
    the reason when the starved pool could not be set up (the check was not run)."""
    return check_allocation_failure_coded(runner, data)[0]


def check_allocation_failure_coded(runner, data: CaseData) -> tuple[str | None, int, str | None]:
    """check_allocation_failure, with what the call returned: (why it was not run or None, its code,
    the code's name)."""
    fill_outputs(runner, data.output_refs, 0)
    synchronize(data.device)
    outcome = runner.starved_call(data.direction, {**data.input_refs, **data.output_refs}, data.scalars, data.dims)
    if outcome.skipped:
        return outcome.skipped, 0, None
    entry = abi.entry_point(runner.spec, data.direction)
    what = (f"{entry} on {data.case.describe()} with no GPU memory left to allocate (every cudaMallocAsync "
            f"failing, as on a nearly full GPU)")
    raise_if_faulted(outcome, what, f"It used memory it did not get, where torch raises a catchable out-of-memory "
                                    f"error: {HINT}")
    check_guards(runner, data, f"with {what}: ")
    if outcome.code:  # it saw the failure and said so: what torch does
        return None, outcome.code, outcome.error
    got = {name: runner.tensor(ref).clone() for name, ref in data.output_refs.items()}
    check_close(data, got, prefix=f"{what}, returning success: ")
    return None, 0, None


# ------------------------------------------------------------------ (verifier version 16) wider, and what comes after
# The call with no memory left ran at the smoke shape only (37 x 37), where a kernel that takes pool
# scratch only past a size (split rows: held-out attacks-v11's softmax_a above 32768 columns) allocates
# nothing. It now runs at the smoke shape, at the widest row of the spec's range (other dims shrunk
# to fit), and with more than SPLIT_ROWS rows where the range allows. And the process goes on after
# a failed allocation: a user catches torch's OutOfMemoryError and retries smaller (Accelerate's
# find_executable_batch_size, the Trainer's auto_find_batch_size). softmax_a returns the error right
# but leaves a std::mutex locked on that path, so every later call blocks forever. After each call
# with no memory left, normal calls (the smoke shape and the widest row, from the request thread, then
# both from another host thread) must finish within the usual watch and be right.

SPLIT_ROWS = 32768  # "many rows": more than this (where kernels commonly split a row or a grid)
MANY_ROWS = 40961  # the rows asked for past SPLIT_ROWS (odd: no other case's size)
MANY_ROWS_WIDTH = 8  # ... with rows this narrow
WIDE_ELEMENTS = 1 << 20  # the widest-row case's other dims shrunk to fit this (or the budget if larger)
AFTER_SEED_OFFSET = 7150  # the calls after: other values than the starved call's
# A stand-in runner (LocalRunner) has no watch of its own; its requests in this check get this many
# seconds (the candidate's process has isolation.CALL_TIMEOUT_S). The tests lower it.
LOCAL_WATCH_S = 45.0

AFTER_HINT = ("Something the failed call took and did not give back on its error path (a std::mutex taken with "
              "lock() and returned from without unlock(), a flag or slot marked busy) is still held: a user who "
              "catches the out-of-memory error and retries with a smaller batch (Accelerate's "
              "find_executable_batch_size, the Trainer's auto_find_batch_size, a serving loop) waits forever, and "
              "in a distributed job every other rank waits in its next collective. Take locks with RAII guards "
              "(std::lock_guard, std::unique_lock, std::scoped_lock) and release everything on every return path, "
              "the error paths included")


def starved_cases(spec, seed: int, budget: int) -> list:
    """The cases a call with no memory left runs at: the smoke shape, the widest row of the range
    (the row's symbol at its top, the other dims at the smoke shape's shrunk to fit WIDE_ELEMENTS or the
    budget), and more than SPLIT_ROWS rows (the first input's first dim with a range past it, rows
    MANY_ROWS_WIDTH wide, other dims at their smallest); each case once."""
    from .strategies import fit_budget, legal_sizes, make_case, row_symbol, smoke_case

    sig = spec.signature
    steps = sig.symbol_divisors()
    smoke = smoke_case(spec, seed)
    cases = [smoke]

    def add(dims: dict, number: int) -> None:
        if all(dict(c.dims) != dims for c in cases):
            cases.append(make_case(dims, spec.dtypes[0], seed=seed + number))

    row = row_symbol(sig)
    if row is not None:
        top = spec.dims[row][1] // steps.get(row, 1) * steps.get(row, 1)
        wide = fit_budget(sig, {**smoke.dim_map, row: top}, spec.dims, max(budget, WIDE_ELEMENTS), keep=row)
        add({**wide, row: top}, 1)
    firsts = [d.symbol for d in sig.inputs[0].type.dims if d.symbol and d.symbol != row] if sig.inputs else []
    many = next((s for s in firsts if spec.dims[s][1] > SPLIT_ROWS), None)
    if many is not None:
        dims = {s: legal_sizes(*spec.dims[s], steps.get(s, 1), [1])[0] for s in smoke.dim_map}
        dims[many] = legal_sizes(*spec.dims[many], steps.get(many, 1), [MANY_ROWS])[0]
        if row is not None:
            dims[row] = legal_sizes(*spec.dims[row], steps.get(row, 1), [MANY_ROWS_WIDTH])[0]
        if dims[many] > SPLIT_ROWS:
            add(dims, 2)
    return cases


class Watched:
    """The runner for this check: an IsolatedRunner as it is (the candidate's process has its own
    watch, and makes every call from its request thread); a stand-in runner's requests made from one
    thread of their own (this check's "request thread", the starved call's too) and waited for at most
    LOCAL_WATCH_S: a request still running then is a hang (Outcome timeout), and every later one too."""

    OWN = ("runner", "dead", "jobs", "thread")

    def __init__(self, runner):
        import queue
        import threading

        object.__setattr__(self, "runner", runner)
        object.__setattr__(self, "dead", None)
        object.__setattr__(self, "jobs", queue.Queue())
        object.__setattr__(self, "thread", threading.Thread(target=self._serve, name="specgen-starved-requests",
                                                            daemon=True))
        self.thread.start()

    def __setattr__(self, name, value):  # (fill_outputs keeps its fills on the runner)
        if name in self.OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self.runner, name, value)

    def _serve(self) -> None:
        while True:
            job, box, done = self.jobs.get()
            if job is None:
                return
            try:
                box["outcome"] = job()
            except BaseException as error:  # noqa: BLE001 - raised in the caller's thread
                box["error"] = error
            done.set()

    def request(self, job):
        import threading

        from .isolation import Outcome

        if self.dead:
            return Outcome(fatal=self.dead, timeout=True)
        box: dict = {}
        done = threading.Event()
        self.jobs.put((job, box, done))
        if not done.wait(LOCAL_WATCH_S):
            self.dead = f"no answer within {LOCAL_WATCH_S:.0f} s"
            return Outcome(fatal=self.dead, timeout=True)
        if "error" in box:
            raise box["error"]
        return box["outcome"]

    def close(self) -> None:
        if not self.dead:
            self.jobs.put((None, None, None))

    def __getattr__(self, name):  # memory, spec, tensor, workspaces...: the runner's own
        return getattr(self.runner, name)

    def starved_call(self, *args, **kw):
        return self.request(lambda: self.runner.starved_call(*args, **kw))

    def call(self, *args, **kw):
        return self.request(lambda: self.runner.call(*args, **kw))

    def threads(self, *args, **kw):
        return self.request(lambda: self.runner.threads(*args, **kw))


def watched(runner):
    """`runner` with a watch on every request (Watched), unless it has one of its own."""
    return runner if getattr(runner, "call_timeout", None) is not None else Watched(runner)


def check_calls_after(runner, starved: CaseData, code: int, error: str | None, after: list[CaseData],
                      stream: str = "legacy") -> None:
    """After the call with no memory left on `starved` (which returned `code`): the `after` cases
    (staged here, threaded.stage_apart: two output sets each) called from the request thread one by
    one, then all from another host thread in turn (one call each); each call must finish within the
    watch and give its inputs' results."""
    from .. import abi
    from .threaded import native_driver, stage_apart
    from .verdict import TIMEOUT, Failure

    entry = abi.entry_point(runner.spec, starved.direction)
    failed = (f"a call whose allocation failed ({entry} on {starved.case.describe()} with no GPU memory left to "
              f"allocate, which returned {error or f'cudaError {code}'})" if code else
              f"a call made with no GPU memory left to allocate ({entry} on {starved.case.describe()}, which "
              f"returned success)")
    sets = stage_apart(runner, after, repeat=2)
    workspaces = runner.workspaces()
    cases = " and ".join(d.case.describe() for d in after)

    def finished(outcome, data: CaseData, which: str) -> None:
        if outcome.timeout:
            raise Failure(TIMEOUT, f"after {failed}, later calls of {entry} never finished: {which} on "
                                   f"{data.case.describe()} did not finish ({outcome.fatal}). {AFTER_HINT}",
                          fatal=True)
        raise_outcome(runner.spec, data, outcome, what=f"after {failed}, {which} on {data.case.describe()}")
        check_guards(runner, data, f"after {failed}, {which}: ")

    def checked(data: CaseData, refs: dict, which: str) -> None:
        got = {name: runner.tensor(ref).clone() for name, ref in refs.items()}
        check_close(data, got, prefix=f"after {failed}, {which} on {data.case.describe()}: ")

    for data, mine in zip(after, sets):
        fill_outputs(runner, mine[0], 0)
        synchronize(data.device)
        which = "a later call from the same host thread"
        outcome = runner.call(data.direction, {**data.input_refs, **mine[0]}, data.scalars, data.dims,
                              stream=stream)
        finished(outcome, data, which)
        checked(data, mine[0], which)
    items = [[{"direction": data.direction,
               "tensors": {**data.input_refs, **mine[-1], **({abi.WORKSPACE: workspaces[0]} if workspaces else {})},
               "scalars": data.scalars, "dims": data.dims} for data, mine in zip(after, sets)]]
    for mine in sets:
        fill_outputs(runner, mine[-1], 1)
    synchronize(after[0].device)
    driver = native_driver() if after[0].device.type == "cuda" else None
    which = f"later calls from another host thread ({cases}, one after the other)"
    outcome = runner.threads(items, len(after), driver, "pool")
    finished(outcome, after[0], which)
    for data, mine in zip(after, sets):
        checked(data, mine[-1], "a later call from another host thread")


def check_starved_calls(session, direction: str, smoke, stream: str = "legacy") -> int:
    """The call with no memory left at each of starved_cases (engine.Session.small_cases), each
    followed by check_calls_after at the smoke shape and the widest row; the calls made. A starved
    pool that could not be set up is named as not run (and so are the calls after it)."""
    import dataclasses

    spec, opts = session.spec, session.options
    runner = watched(session.runner)
    made = 0
    try:
        from .strategies import row_symbol

        cases = starved_cases(spec, smoke.seed, opts.budget)
        row = row_symbol(spec.signature)
        wide = max(cases, key=lambda c: c.dim_map.get(row, 0)) if row else cases[0]  # the widest row's case
        for number, case in enumerate(cases):
            session.progress(f"{direction}: a call with no GPU memory left to allocate, {case.describe()}, "
                             f"then calls after it")
            starved = session.prepare(dataclasses.replace(case, seed=case.seed + 7100), direction)
            stage(runner, starved, snapshots=False)
            skipped, code, error = check_allocation_failure_coded(runner, starved)
            made += 1
            if skipped is not None:
                session.not_run(f"{direction}: the call with no GPU memory left", skipped)
                return made
            after = [session.prepare(dataclasses.replace(c, seed=c.seed + AFTER_SEED_OFFSET + 10 * number), direction)
                     for c in (cases[0], wide)]
            check_calls_after(runner, starved, code, error, after, stream)
            made += 2 * len(after)
            del starved, after
    finally:
        if isinstance(runner, Watched):
            runner.close()
    return made
