"""W&B logging (`--wandb`, `MetricsLogger(wandb=...)`) in offline mode: the runs write their files
locally (no network), their history holds the records of metrics.jsonl (numbers, tagged
`stage/key`, against `step`), and `--resume` continues the same W&B run.

The offline run's history is read back from its `run-ID.wandb` file: a LevelDB-style log of
`wandb_internal_pb2.Record` protobufs (wandb >= 0.2x has no Python reader of its own)."""

import dataclasses
import json
import math
import socket
import struct
import sys

import flax
import numpy as np
import pytest

from jaxrl_suite.algorithms.loop import fit_resumable
from jaxrl_suite.cli import SMOKE_NOTE, main
from jaxrl_suite.core.config import ConfigError
from jaxrl_suite.core.experiment import EXPERIMENTS, Experiment
from jaxrl_suite.core.metrics import (
    WANDB_RUN_FILE,
    MetricsLogger,
    WandbConfig,
    WandbOptions,
    read_metrics,
    wandb_options,
)
from jaxrl_suite.core.study import open_run_log

PROBE = "wandb_probe"


def _wandb():
    return pytest.importorskip("wandb", reason="the wandb extra is not installed "
                               "(pip install 'jaxrl_suite[wandb]')")


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """W&B offline with every directory of its own under tmp_path; a connection from this process
    to anything but a local socket (W&B's service) fails the test."""
    wandb = _wandb()
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb_home" / var.lower()))
    for var in ("WANDB_DIR", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_RUN_ID", "WANDB_RESUME"):
        monkeypatch.delenv(var, raising=False)
    connect = socket.socket.connect

    def local_only(sock, address):
        local = sock.family == socket.AF_UNIX or (
            isinstance(address, tuple) and address[0] in ("127.0.0.1", "::1", "localhost"))
        if not local:
            raise AssertionError(f"W&B offline opened a network connection to {address}")
        return connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", local_only)
    yield tmp_path
    wandb.teardown()  # W&B's service and settings do not outlive the test


# ---- reading an offline run back ----
def _records(path):
    """The protobuf records of a `.wandb` file (LevelDB log format: 32 KiB blocks of chunks, each
    with a 7-byte header: crc32, length, type 1 full / 2 first / 3 middle / 4 last)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    ident, magic, _version = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B" and magic == 0xBEE1, f"{path} is not a W&B run file"
    pos, pending, out, block = 7, b"", [], 32768
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out


def _offline_runs(root, run_id):
    """The run files of `run_id`'s offline run dirs under `root`, oldest first: one per init (a
    resumed run adds one: offline-run-TIME-ID, or offline-run-TIME-ID-N within the same
    second)."""
    def order(path):
        time, _, n = path.parent.name.removeprefix("offline-run-").partition(f"-{run_id}")
        return time, int(n.lstrip("-") or 0)

    return sorted(root.rglob(f"offline-run-*-{run_id}*/run-{run_id}.wandb"), key=order)


def _settle():
    """Stop W&B's service process, which writes the run files asynchronously: after it, they are
    complete."""
    import wandb

    wandb.teardown()


def _read_run(run_file):
    """{"run": the run record, "history": [row dicts without W&B's own `_` keys]}."""
    records = _records(run_file)
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    history = []
    for r in records:
        if r.WhichOneof("record_type") == "history":
            row = {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                   for i in r.history.item}
            history.append({k: v for k, v in row.items() if not k.startswith("_")})
    return {"run": run, "history": history}


def _expected_rows(records):
    """What W&B should hold of metrics.jsonl records: per record its step and its numbers (not
    step, not lists nor strings), tagged `stage/key` when it has a stage."""
    rows = []
    for rec in records:
        prefix = f"{rec['stage']}/" if "stage" in rec else ""
        rows.append({"step": rec["step"], **{
            prefix + k: v for k, v in rec.items()
            if k != "step" and isinstance(v, int | float) and not isinstance(v, bool)}})
    return rows


def _same(a, b):
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    for k in a:
        if isinstance(a[k], float) and math.isnan(a[k]):
            assert isinstance(b[k], float) and math.isnan(b[k]), k
        else:
            assert b[k] == pytest.approx(a[k], rel=1e-6), k


def _assert_history_matches(history, records):
    expected = _expected_rows(records)
    assert len(history) == len(expected)
    for row, want in zip(history, expected, strict=True):
        _same(want, row)


def _run_id(log_dir):
    return json.loads((log_dir / WANDB_RUN_FILE).read_text())["id"]


# ---- MetricsLogger ----
RECORDS = [
    {"step": 1, "stage": "sft", "loss": 2.5, "grad_norm": 1.25, "note": "text", "ok": True},
    {"step": 2, "stage": "sft", "loss": 2.0, "per_seed": [1.0, 2.0], "count": 7},
    {"step": 3, "stage": "grpo", "loss": 0.5, "reward": 0.25, "kl": float("nan")},
    {"step": 3, "accuracy": 0.75},  # a record without a stage: plain keys
]


def test_wandb_offline_logs_the_records_of_metrics_jsonl(offline, monkeypatch):
    wandb_dir = offline / "wb"
    wandb_dir.mkdir()
    monkeypatch.setenv("WANDB_DIR", str(wandb_dir))
    log_dir = offline / "out" / "runs" / "grpo_s0"
    opts = WandbOptions(project="probe", group="out", job_type="unit test",
                        config={"experiment": "x", "config": {"lr": 0.1}})
    with MetricsLogger(log_dir, wandb=opts) as log:
        for rec in RECORDS:
            log.log(rec)
        summary = dict(log.wandb_run.summary)
    _settle()
    records = read_metrics(log_dir / "metrics.jsonl")
    assert len(records) == len(RECORDS)
    run_file, = _offline_runs(wandb_dir, _run_id(log_dir))  # under WANDB_DIR, not log_dir
    assert not (log_dir / "wandb").exists()
    got = _read_run(run_file)
    _assert_history_matches(got["history"], records)
    assert "note" not in str(got["history"]) and "per_seed" not in str(got["history"])
    run = got["run"]
    assert (run.project, run.run_group, run.job_type, run.display_name) == \
        ("probe", "out", "unit test", "out/grpo_s0")
    config = {u.key: json.loads(u.value_json) for u in run.config.update}
    assert config["config"] == {"lr": 0.1} and config["experiment"] == "x"
    # the summary: each key's last value
    assert summary["sft/loss"] == 2.0 and summary["grpo/reward"] == 0.25
    assert summary["accuracy"] == 0.75 and summary["step"] == 3


def test_resume_continues_the_same_wandb_run(offline):
    log_dir = offline / "run"
    opts = WandbOptions(project="probe")
    with MetricsLogger(log_dir, wandb=opts) as log:
        for step in range(1, 5):
            log.log({"step": step, "stage": "sft", "loss": 1.0 / step})
    first = _run_id(log_dir)
    # resumed from the checkpoint of step 2: steps 3, 4 are logged again, then 5
    with MetricsLogger(log_dir, resume_step=3, wandb=WandbOptions()) as log:
        assert log.wandb_run.id == first
        for step in range(3, 6):
            log.log({"step": step, "stage": "sft", "loss": 1.0 / step})
    _settle()
    stored = json.loads((log_dir / WANDB_RUN_FILE).read_text())
    assert stored == {"id": first, "project": "probe", "entity": None}  # the project goes on
    runs = _offline_runs(log_dir / "wandb", first)  # no WANDB_DIR: beside metrics.jsonl
    assert len(runs) == 2
    before, after = (_read_run(r) for r in runs)
    assert after["run"].project == "probe" and after["run"].run_id == first
    assert [r["step"] for r in before["history"]] == [1, 2, 3, 4]
    _assert_history_matches(after["history"], read_metrics(log_dir / "metrics.jsonl")[2:])
    # a fresh (not resumed) log in the same dir starts a new W&B run
    with MetricsLogger(log_dir, wandb=opts) as log:
        log.log({"step": 1, "loss": 1.0})
    assert _run_id(log_dir) != first


def test_online_without_a_login_is_one_line(offline, monkeypatch):
    monkeypatch.setenv("HOME", str(offline / "home"))  # no ~/.netrc
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    with pytest.raises(ConfigError) as err:
        MetricsLogger(offline / "log", wandb=WandbOptions(mode="online"))
    msg = str(err.value)
    assert "\n" not in msg and "API key" in msg and "--wandb-mode offline" in msg


def test_a_missing_wandb_package_is_one_line_naming_the_extra(monkeypatch, tmp_path, capsys,
                                                              probe):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'jaxrl_suite\[wandb\]'"):
        MetricsLogger(tmp_path / "log", wandb=WandbOptions())
    out = tmp_path / "out"
    assert main(["run", PROBE, "--out", str(out), "--wandb"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "jaxrl_suite[wandb]" in err and "--wandb" in err
    assert not out.exists()  # refused before anything was written


def test_wandb_flags_without_wandb_and_a_bad_mode_are_one_line(tmp_path, capsys, probe):
    out = tmp_path / "out"
    assert main(["run", PROBE, "--out", str(out), "--wandb-project", "p"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "jaxrl-suite: error: --wandb-project needs --wandb (or run.wandb.enabled)"
    assert not out.exists()
    with pytest.raises(ConfigError, match="wandb mode 'cloud' must be one of online, offline"):
        WandbOptions(mode="cloud")


# ---- through the CLI ----
@flax.struct.dataclass
class _State:
    step: np.ndarray
    w: np.ndarray


class _Trainer:
    """Adds 1 to w per step; raises KeyboardInterrupt (Ctrl-C) at step `_INTERRUPT[0]`."""

    def batch(self, cursor):
        return [cursor]

    def step(self, state, examples):
        step = int(state.step) + 1
        if step == _INTERRUPT[0]:
            raise KeyboardInterrupt
        return _State(np.int32(step), state.w + 1), {"loss": 1.0 / step, "w": float(state.w[0])}


_INTERRUPT = [0]


@dataclasses.dataclass(frozen=True)
class _Run:
    wandb: WandbConfig = WandbConfig()


@dataclasses.dataclass(frozen=True)
class _Cfg:
    steps: int = 6
    run: _Run = _Run()


def _probe_run(cfg, opts):
    """One resumable stage logged through `open_run_log`, as the experiments log."""
    ckpt = opts.out_dir / "checkpoints" / "probe"
    with open_run_log(opts.out_dir, [(ckpt, 0)], resume=opts.resume,
                      tensorboard=opts.tensorboard, wandb=opts.wandb) as log:
        fit_resumable(_Trainer(), _State(np.int32(0), np.zeros(2)), stage="probe",
                      num_steps=cfg.steps, checkpoint_dir=ckpt, logger=log, save_every=2, keep=2,
                      resume=opts.resume, progress=False)
    return {}


@pytest.fixture
def probe(tmp_path_factory):
    yaml = tmp_path_factory.mktemp("wandb_probe") / "probe.yaml"
    yaml.write_text("steps: 6\n")
    # registered for the test only: other tests in the worker walk every registered experiment
    EXPERIMENTS.register(PROBE, Experiment(PROBE, _Cfg, _probe_run, config=yaml))
    yield PROBE
    EXPERIMENTS.unregister(PROBE)
    _INTERRUPT[0] = 0


def test_run_wandb_in_the_config_turns_wandb_on_and_may_change_on_resume(offline, probe):
    out = offline / "cfg_on"
    on = ["--set", "run.wandb.enabled=true", "--set", "run.wandb.project=from-config",
          "--set", "run.wandb.mode=offline"]
    _INTERRUPT[0] = 3
    assert main(["run", PROBE, "--out", str(out), *on]) == 130  # no --wandb flag
    _INTERRUPT[0] = 0
    first = _run_id(out)  # a W&B run was started from the config alone
    assert main(["run", PROBE, "--out", str(out), "--resume", *on,
                 "--set", "run.wandb.project=renamed"]) == 0  # allowed on resume, and logged
    assert _run_id(out) == first
    resumes = [json.loads(line) for line in (out / "resumes.jsonl").read_text().splitlines()]
    assert resumes[-1]["changed"] == {"run.wandb.project": {"from": "from-config",
                                                            "to": "renamed"}}


def test_cli_resume_continues_the_wandb_run_of_the_interrupted_one(offline, probe, capsys):
    out = offline / "out"
    argv = ["run", PROBE, "--out", str(out), "--wandb", "--wandb-project", "probe"]
    _INTERRUPT[0] = 5  # Ctrl-C at step 5: steps 1-4 logged, step 4 checkpointed
    assert main(argv) == 130
    first = _run_id(out)
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3, 4]
    _INTERRUPT[0] = 0
    assert main(["run", PROBE, "--out", str(out), "--wandb", "--resume"]) == 0
    assert _run_id(out) == first
    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    _settle()
    stopped, resumed = (_read_run(r) for r in _offline_runs(out / "wandb", first))
    assert stopped["run"].project == resumed["run"].project == "probe"
    assert resumed["run"].run_group == "out" and resumed["run"].job_type == PROBE
    _assert_history_matches(stopped["history"] + resumed["history"], records)
    config = {u.key: json.loads(u.value_json) for u in resumed["run"].config.update}
    assert config["config"]["steps"] == 6 and config["experiment"] == PROBE
    assert SMOKE_NOTE not in capsys.readouterr().out  # not a --smoke run


def test_cli_wandb_smoke_run_of_an_lm_study_matches_its_metrics(offline, monkeypatch, capsys):
    """A real experiment end to end: every run of the study (runs/*/metrics.jsonl) is a W&B run
    of the launch's group whose history is its metrics.jsonl."""
    wandb_dir = offline / "wb"
    wandb_dir.mkdir()
    monkeypatch.setenv("WANDB_DIR", str(wandb_dir))
    out = offline / "g"
    assert main(["run", "grpo_arithmetic", "--smoke", "--no-progress", "--out", str(out),
                 "--wandb", "--wandb-mode", "offline"]) == 0
    assert capsys.readouterr().out.rstrip().splitlines()[-1] == SMOKE_NOTE
    _settle()
    logs = sorted(p.parent for p in out.glob("runs/*/metrics.jsonl"))
    assert [p.name for p in logs] == ["grpo_s0", "sft_more_s0"]
    ids = set()
    for log_dir in logs:
        records = read_metrics(log_dir / "metrics.jsonl")
        assert {r["stage"] for r in records} >= {"sft_more"} or \
            {r["stage"] for r in records} >= {"sft", "grpo"}
        run_file, = _offline_runs(wandb_dir, _run_id(log_dir))
        got = _read_run(run_file)
        _assert_history_matches(got["history"], records)
        assert got["run"].run_group == "g" and got["run"].display_name == f"g/{log_dir.name}"
        assert got["run"].project == "jaxrl_suite" and got["run"].job_type == "grpo_arithmetic"
        ids.add(got["run"].run_id)
    assert len(ids) == len(logs)


# ---- run.wandb and the Python API ----
def test_run_wandb_config_turns_wandb_on_and_the_flags_override_it():
    _wandb()  # turned on, wandb_options checks that the package is there
    assert wandb_options(WandbConfig()) is None  # off by default
    assert wandb_options(None, enabled=False, project="p") is None
    on = WandbConfig(enabled=True, project="cfg-project", mode="offline")
    opts = wandb_options(on, project=None, entity="me", group="g", job_type="j")
    assert (opts.project, opts.entity, opts.mode, opts.group) == ("cfg-project", "me", "offline",
                                                                  "g")
    assert wandb_options(on, project="flag-project").project == "flag-project"
    assert wandb_options(None, enabled=True).project is None  # W&B's own default
    with pytest.raises(ConfigError, match="'run.wandb.mode' 'cloud' must be one of online"):
        WandbConfig(mode="cloud")


def test_the_python_api_logs_its_metrics_to_an_offline_wandb_run(offline, monkeypatch):
    from jaxrl_suite import GRPO, LM

    wandb_dir = offline / "wb"
    wandb_dir.mkdir()
    monkeypatch.setenv("WANDB_DIR", str(wandb_dir))
    prompts = [{"prompt": f"{a}+{a}=", "answer": str(2 * a)} for a in range(10, 16)]
    out = offline / "api_run"
    with pytest.raises(ConfigError, match="unknown wandb option 'projekt'"):
        GRPO(LM.small(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64),
             reward_funcs=lambda completion, answer: 0.0, train_prompts=prompts,
             wandb={"projekt": "x"}, out_dir=out)
    trainer = GRPO(LM.small(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64),
                   reward_funcs=lambda completion, answer: float(completion == answer),
                   train_prompts=prompts, progress=False, out_dir=out,
                   config={"steps": 2, "prompts_per_step": 2, "group_size": 2,
                           "max_new_tokens": 4},
                   wandb={"project": "api-probe", "mode": "offline"}).train()
    _settle()
    records = trainer.metrics
    assert [r["step"] for r in records] == [1, 2]
    run_file, = _offline_runs(wandb_dir, _run_id(out))
    got = _read_run(run_file)
    _assert_history_matches(got["history"], records)
    assert got["run"].project == "api-probe" and got["run"].run_group == "api_run"
    assert got["run"].job_type == "api.grpo"
