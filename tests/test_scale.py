"""Scale-out on the CPU (specgen/scale/): the local backend with fake GPU ids, workers that die
or hang, the lock written only by the client, and the build-wide LLM budget and wall time
against the fake OpenAI-compatible server. The Dask backend: tests/test_scale_dask.py."""
from __future__ import annotations

import json
import time

import pytest

import scale_fakes as fakes
from agents_support import SPEC_YAML, answer
from fake_llm_server import FakeLLMServer
from specgen import cli
from specgen.errors import UsageError
from specgen.scale import WorkerLost, parse_gpus
from specgen.scale.budget import BudgetedAgent, FileLedger
from specgen.scale.local import LocalExecutor


# ---------------------------------------------------------------------------- options

def test_parse_gpus():
    assert parse_gpus("all", ["0", "1", "2"]) == ["0", "1", "2"]
    assert parse_gpus("0,2", ["0", "1", "2"]) == ["0", "2"]
    assert parse_gpus("1", ["4", "5"]) == ["5"]  # indices into CUDA_VISIBLE_DEVICES
    for bad, visible in (("all", []), ("0,0", ["0", "1"]), ("x", ["0"]), ("3", ["0", "1"])):
        with pytest.raises(UsageError):
            parse_gpus(bad, visible)


# ---------------------------------------------------------------------------- local backend

@pytest.fixture
def local():
    executor = LocalExecutor(["0", "1"], cpu_workers=1, task_timeout=20)
    events = []
    executor.on_event(events.append)
    executor.events = events
    yield executor
    executor.close()


def test_local_pins_one_worker_per_gpu_and_never_shares_a_gpu(local):
    futures = [local.submit(fakes.sleep_then, 0.3, i, label=f"t{i}") for i in range(6)]
    where = [local.submit(fakes.whoami, i, label=f"w{i}") for i in range(4)]
    assert [f.result(timeout=60) for f in futures] == list(range(6))
    seen = {w.result(timeout=60)["cuda"] for w in where}
    assert seen <= {"0", "1"} and seen  # each worker sees its one GPU only
    cpu = local.submit(fakes.whoami, "cpu", gpu=False).result(timeout=60)
    assert cpu["cuda"] == "" and cpu["slot"] == "cpu0"
    # one task at a time per GPU: the start/done events of one slot never interleave
    for slot in ("gpu0", "gpu1"):
        running = 0
        for event in (e for e in local.events if e.get("slot") == slot and e["type"] in ("start", "done")):
            running += 1 if event["type"] == "start" else -1
            assert running in (0, 1)
    assert any(e["type"] == "log" and e["text"] == "running 0" for e in local.events)


def test_local_task_error_is_its_result_not_retried(local):
    with pytest.raises(ValueError, match="boom"):
        local.submit(fakes.fail, "boom").result(timeout=60)
    assert not [e for e in local.events if e["type"] == "retry"]


def test_local_worker_killed_mid_task_is_replaced_and_the_task_retried_once(local, tmp_path):
    assert local.submit(fakes.die_once, str(tmp_path / "m"), 5).result(timeout=60) == 5
    assert [e["type"] for e in local.events].count("retry") == 1
    with pytest.raises(WorkerLost, match="died .*exit code 7.* then .*died"):
        local.submit(fakes.always_die, label="doomed").result(timeout=60)
    assert any(e["type"] == "failed" and e["label"] == "doomed" for e in local.events)
    assert local.submit(fakes.square, 3).result(timeout=60) == 9  # the workers were replaced


def test_local_hung_worker_is_killed_and_the_task_retried(tmp_path):
    with LocalExecutor(["0"], cpu_workers=0, task_timeout=3) as executor:
        started = time.monotonic()
        assert executor.submit(fakes.hang_once, str(tmp_path / "h"), 6).result(timeout=60) == 6
        assert time.monotonic() - started < 40


def test_local_cancel_before_start(tmp_path):
    with LocalExecutor(["0"], cpu_workers=0) as executor:
        first = executor.submit(fakes.sleep_then, 1.0, 1)
        second = executor.submit(fakes.square, 2)
        assert executor.cancel(second)
        assert first.result(timeout=60) == 1 and second.cancelled()
        assert executor.submit(fakes.square, 3, gpu=False).result(timeout=60) == 9  # no CPU worker: a GPU one


# ---------------------------------------------------------------------------- the budget ledger

def test_file_ledger_and_budgeted_agent(tmp_path):
    from specgen.agents.base import AgentExhausted, Candidate, Usage

    class Paid:
        name, model = "openai-compatible", "m"

        def propose(self, task, history):
            return Candidate("src", self.name, self.model, usage=Usage(1, 1, 1.0))

    ledger = FileLedger(tmp_path / "ledger.json", budget_usd=2.0)
    agent = BudgetedAgent(Paid(), ledger)
    agent.propose(None, [])
    agent.propose(None, [])
    assert ledger.spent() == pytest.approx(2.0)
    with pytest.raises(AgentExhausted, match="cost budget"):
        agent.propose(None, [])
    late = BudgetedAgent(Paid(), FileLedger(tmp_path / "other.json", deadline=time.time() - 1))
    with pytest.raises(AgentExhausted, match="wall time"):
        late.propose(None, [])


# ---------------------------------------------------------------------------- `specgen generate --gpus`

def _two_specs(tmp_path):
    folder = tmp_path / "specs"
    folder.mkdir(parents=True)
    (folder / "scale_add.yaml").write_text(SPEC_YAML)
    (folder / "scale_addb.yaml").write_text(SPEC_YAML.replace("scale_add", "scale_addb"))
    return folder


def _responder(valid: bool):
    """An answer for the spec the request is about (two specs ask at once)."""
    def respond(body):
        text = json.dumps(body.get("messages", []))
        op = "scale_addb" if "scale_addb" in text else "scale_add"
        if not valid:
            return "x" * 400  # no code: 100 output tokens, priced below
        return answer("FAST").replace("scale_add", op)
    return respond


def _generate(folder, server, tmp_path, *extra):
    return cli.main(["generate", str(folder), "--agent", "openai-compatible", "--base-url", server.openai_base_url,
                     "--model", "priced-model", "--transcript-dir", str(tmp_path / "transcripts"), *extra])


@pytest.fixture
def priced(tmp_path, monkeypatch):
    models = tmp_path / "models.toml"  # 100 output tokens = $1.00
    models.write_text('[models."priced-model"]\ninput_per_mtok = 0.0\noutput_per_mtok = 10000.0\n')
    monkeypatch.setenv("SPECGEN_MODELS", str(models))
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path / "cache"))
    # --gpus 0,1 picks these two ids, which name no real GPU: the workers see none (compile
    # feedback only) even on a GPU machine
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-fake-0,GPU-fake-1")
    monkeypatch.setattr("specgen.lock.gpu_available", lambda: False)


@pytest.mark.nvcc
@pytest.mark.slow
def test_generate_gpus_lock_written_once_by_the_client_and_same_as_one_gpu(tmp_path, priced, monkeypatch):
    from specgen.lock import Lock

    writes = []
    original = Lock._write_lock
    monkeypatch.setattr(Lock, "_write_lock", lambda self: (writes.append(str(self.path)), original(self))[1])
    scaled = _two_specs(tmp_path / "a")
    with FakeLLMServer() as server:
        server.responder = _responder(True)
        _generate(scaled, server, tmp_path, "--gpus", "0,1", "--attempts", "2")
    assert writes == [str(scaled / "specgen.lock")] * 2  # one adoption per spec, here, in the client
    serial = _two_specs(tmp_path / "b")
    with FakeLLMServer() as server:
        server.responder = _responder(True)
        _generate(serial, server, tmp_path, "--attempts", "2")

    def content(folder):
        ops = json.loads((folder / "specgen.lock").read_text())["ops"]
        return {op: {k: v for k, v in e.items() if k != "created"} for op, e in ops.items()}

    assert content(scaled) == content(serial) and set(content(scaled)) == {"scale_add", "scale_addb"}
    for op in ("scale_add", "scale_addb"):
        assert (scaled / "kernels" / f"{op}.cu").read_text() == (serial / "kernels" / f"{op}.cu").read_text()
    


def test_generate_gpus_budget_spans_the_whole_build(tmp_path, priced):
    folder = _two_specs(tmp_path)
    with FakeLLMServer() as server:
        server.responder = _responder(False)  # every answer costs $1 and has no code
        code = _generate(folder, server, tmp_path, "--gpus", "0,1", "--attempts", "5", "--budget-usd", "2.5")
        scaled = len(server.requests)
    assert code == 1
    # per spec, $2.5 would allow 3 requests each (6); across the build: 3, plus at most one in flight
    assert 3 <= scaled <= 4


def test_generate_gpus_wall_time_spans_the_whole_build(tmp_path, priced):
    folder = _two_specs(tmp_path)
    with FakeLLMServer() as server:
        server.responder = _responder(False)
        code = _generate(folder, server, tmp_path, "--gpus", "0,1", "--wall-time", "0.01")
        assert len(server.requests) == 0  # the build's deadline passed before any worker asked
    assert code == 1


# ---------------------------------------------------------------------------- `specgen build --gpus`

@pytest.mark.nvcc
@pytest.mark.slow
def test_build_resolve_on_fake_gpus_matches_the_one_gpu_path(tmp_path, monkeypatch):
    """The per-op step of `specgen build` (builtin agent, no GPU: compile only) through two
    workers gives the same results and lock as the one-GPU path."""
    from rich.console import Console

    from specgen.cli import build_parser
    from specgen.commands import build, load_specs
    from specgen.scale.run import Session

    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-fake-0,GPU-fake-1")
    monkeypatch.setattr("specgen.lock.gpu_available", lambda: False)
    runs = {}
    for name, extra in (("scaled", ["--gpus", "0,1"]), ("serial", [])):
        folder = _two_specs(tmp_path / name)
        args = build_parser().parse_args(["build", str(folder), "--transcript-dir", str(tmp_path / "t"), *extra])
        specs = load_specs([str(folder)])
        console = Console(file=open(tmp_path / f"{name}.log", "w"), width=200)
        if extra:
            results = Session(args, console).resolve_build(specs)
        else:
            results = build._resolve(specs, args, console)
        lock = json.loads((folder / "specgen.lock").read_text())["ops"]
        runs[name] = ([(r.spec.name, r.kernel, r.action, r.problem, r.provenance.get("status")) for r in results],
                      {op: {k: v for k, v in e.items() if k != "created"} for op, e in lock.items()})
    assert runs["scaled"] == runs["serial"]
    assert [r[2] for r in runs["scaled"][0]] == ["generated", "generated"]
    log = (tmp_path / "scaled.log").read_text()
    assert "GPU-fake-0 scale_add" in log or "GPU-fake-1 scale_add" in log  # which GPU ran which spec


def test_an_error_in_a_scratch_copy_names_the_real_spec(tmp_path):
    from specgen.errors import SpecError
    from specgen.scale.tasks import reference_check_task, spec_payload
    from specgen.spec import load_spec

    path = tmp_path / "scale_add.yaml"
    path.write_text(SPEC_YAML)
    payload = spec_payload(load_spec(path))
    broken = dict(payload, files={"scale_add.yaml": SPEC_YAML.replace("return 2 * x + 1", "return nope")})
    with pytest.raises(SpecError) as caught:
        reference_check_task(broken)  # not the file on disk: checked in a scratch copy
    assert str(caught.value).startswith(f"{tmp_path}/scale_add.yaml:") and "specgen-task-" not in str(caught.value)


def test_scale_options_are_checked(tmp_path):
    path = tmp_path / "scale_add.yaml"
    path.write_text(SPEC_YAML)
    assert cli.main(["generate", str(path), "--backend", "dask"]) == 2
    assert cli.main(["generate", str(path), "--gpus", "0,x"]) == 2
    assert cli.main(["generate", str(path), "--scheduler", "tcp://h:1", "--backend", "local"]) == 2


@pytest.mark.nvcc
def test_samples_are_compiled_as_they_arrive_and_the_loop_finds_them_cached(tmp_path, monkeypatch):
    from agents_support import FAST, make_task
    from specgen.agents.base import Candidate
    from specgen.scale.budget import PrecompilingAgent, active, wrap_agent
    from specgen.toolchain import compile_kernel

    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path / "cache"))
    task = make_task(tmp_path)

    class Inner:
        name, model = "openai-compatible", "m"

        def propose(self, task, history):
            return Candidate(FAST, self.name, self.model)

    with active(None, samples=2, arch="sm_90"):
        agent = wrap_agent(Inner())
    assert isinstance(agent, PrecompilingAgent)
    candidate = agent.propose(task, [])
    include = tmp_path / "inc"
    include.mkdir()
    (include / task.header_name).write_text(task.header)
    again = compile_kernel(candidate.source, include_dirs=[include], arch="sm_90", name=task.spec.name,
                           source_name=f"{task.spec.name}.cu")
    assert again.cached  # what KernelEvaluator.compile asks for is already in the cache
    with active(None, samples=1):
        assert wrap_agent(Inner()).__class__ is Inner  # one sample: nothing to overlap


def test_a_spec_whose_worker_dies_twice_is_reported_and_the_others_go_on(tmp_path):
    import argparse
    import io

    from rich.console import Console

    from specgen.commands import load_specs
    from specgen.scale.run import Session

    folder = _two_specs(tmp_path)
    specs = load_specs([str(folder)])
    args = argparse.Namespace(budget_usd=None, wall_time=None, scheduler=None, gpus="0,1")
    out = io.StringIO()
    session = Session(args, Console(file=out, width=200), executor=LocalExecutor(["0", "1"], cpu_workers=0))
    seen = {}
    session._run_specs(specs, fakes.spec_task_dying_on("scale_addb"),
                       lambda spec, result, lost: seen.setdefault(spec.name, (result, lost)))
    assert seen["scale_add"][0]["action"] == "reused" and seen["scale_add"][1] is None
    assert isinstance(seen["scale_addb"][1], WorkerLost) and "exit code 3" in str(seen["scale_addb"][1])
    log = out.getvalue()
    assert "scale_addb: worker lost" in log and "retrying once" in log and "reported" in log
