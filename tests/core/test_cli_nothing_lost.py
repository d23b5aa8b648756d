"""Nothing lost (issue 43): `run` into a folder that holds an earlier run refuses in one line
unless given --resume or --overwrite, and --overwrite moves the earlier run aside; Ctrl-C and
SIGTERM end in one line with the command that resumes, SIGTERM after checkpointing its step."""

import dataclasses
import json
import os
import signal
from collections.abc import Mapping
from typing import ClassVar

import flax
import numpy as np
import pytest
from lm_helpers import flat_grpo_keys

from jaxrl_suite.algorithms.loop import fit
from jaxrl_suite.cli import SMOKE_NOTE, main
from jaxrl_suite.core.checkpoint import Checkpointer
from jaxrl_suite.core.config import ConfigError, load_config, to_dict
from jaxrl_suite.core.experiment import EXPERIMENTS, Experiment, load_experiments
from jaxrl_suite.core.metrics import MetricsLogger
from jaxrl_suite.core.rundir import resume_changes
from jaxrl_suite.core.signals import Terminated, stop_on_sigterm

NAME = "outdir_probe"


@dataclasses.dataclass(frozen=True)
class _Run:
    checkpoint_every: int = 5


@dataclasses.dataclass(frozen=True)
class _Cfg:
    MOVED: ClassVar[Mapping[str, str]] = {"every": "run.checkpoint_every"}  # a key that moved
    x: int = 0
    run: _Run = _Run()
    interrupt: str = ""  # "", "sigint" or "sigterm" at step `at` of 10
    at: int = 3


@flax.struct.dataclass
class _State:
    step: np.ndarray
    w: np.ndarray


class _Counter:
    """A trainer whose step adds 1 to w; at step `at` it signals itself as `interrupt` says."""

    def __init__(self, interrupt: str, at: int = 3):
        self.interrupt, self.at = interrupt, at

    def batch(self, cursor):
        return [cursor]

    def step(self, state, examples):
        step = int(state.step) + 1
        if step == self.at and self.interrupt == "sigint":
            raise KeyboardInterrupt
        if step == self.at and self.interrupt == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)  # the handler only sets a flag
        return _State(np.int32(step), state.w + 1), {"loss": 0.0}


def _fit(trainer, directory, logdir):
    ckpt = Checkpointer(directory, save_every=5, keep=2)
    with MetricsLogger(logdir) as logger:
        try:
            return fit(trainer, _State(np.int32(0), np.zeros(2)), stage="probe", num_steps=10,
                       cursor=0, checkpointer=ckpt, logger=logger, progress=False)
        finally:
            ckpt.close()


def _probe_run(cfg, opts):
    """What a run leaves (beside the config.json the CLI writes): a checkpoint file and
    summary.json."""
    if cfg.x < 0:  # a check the experiment makes when it starts
        raise ConfigError("x must be >= 0")
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    if cfg.interrupt:
        _fit(_Counter(cfg.interrupt, cfg.at), opts.out_dir / "checkpoints" / "probe", opts.out_dir)
    (opts.out_dir / "checkpoints").mkdir(exist_ok=True)
    (opts.out_dir / "checkpoints" / "step").write_text(str(cfg.x))
    (opts.out_dir / "summary.json").write_text(json.dumps({"x": cfg.x, "resumed": opts.resume}))
    return {}


@pytest.fixture(scope="module")
def probe_yaml(tmp_path_factory):
    yaml = tmp_path_factory.mktemp("probe") / "probe.yaml"
    yaml.write_text("x: 1\n")
    # registered for this module only: other tests in the worker walk every registered experiment
    EXPERIMENTS.register(NAME, Experiment(NAME, _Cfg, _probe_run, config=yaml))
    yield yaml
    EXPERIMENTS.unregister(NAME)


@pytest.fixture
def probe(probe_yaml, tmp_path):
    return tmp_path / "out"


def _summary(out):
    return json.loads((out / "summary.json").read_text())


def test_a_second_run_into_the_same_folder_refuses_and_keeps_everything(probe, capsys):
    assert main(["run", NAME, "--out", str(probe)]) == 0
    before = {p.relative_to(probe): p.read_bytes() for p in probe.rglob("*") if p.is_file()}
    assert main(["run", NAME, "--out", str(probe), "--set", "x=2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(probe) in err and "--resume" in err and "--overwrite" in err
    after = {p.relative_to(probe): p.read_bytes() for p in probe.rglob("*") if p.is_file()}
    assert after == before  # nothing deleted, nothing written


def test_overwrite_moves_the_earlier_run_aside(probe, capsys):
    assert main(["run", NAME, "--out", str(probe)]) == 0
    assert main(["run", NAME, "--out", str(probe), "--overwrite", "--set", "x=2"]) == 0
    assert _summary(probe)["x"] == 2
    old, = probe.parent.glob("out.old-*")
    assert _summary(old)["x"] == 1 and (old / "checkpoints" / "step").read_text() == "1"
    assert str(old) in capsys.readouterr().err
    # a second overwrite in the same second gets a folder of its own
    assert main(["run", NAME, "--out", str(probe), "--overwrite", "--set", "x=3"]) == 0
    olds = sorted(probe.parent.glob("out.old-*"))
    assert len(olds) == 2 and sorted(_summary(o)["x"] for o in olds) == [1, 2]


def test_resume_and_overwrite_together_is_one_line(probe, capsys):
    assert main(["run", NAME, "--out", str(probe), "--resume", "--overwrite"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--resume" in err and "--overwrite" in err and "\n" not in err


def test_a_folder_without_a_run_is_used_and_its_files_kept(probe):
    probe.mkdir()
    (probe / "notes.txt").write_text("mine")
    assert main(["run", NAME, "--out", str(probe)]) == 0
    assert (probe / "notes.txt").read_text() == "mine" and _summary(probe)["x"] == 1


def test_sigterm_checkpoints_the_step_in_progress_and_stops(tmp_path):
    with stop_on_sigterm(), pytest.raises(Terminated, match="probe step 3 checkpointed"):
        _fit(_Counter("sigterm"), tmp_path / "ck", tmp_path)
    ck = Checkpointer(tmp_path / "ck")
    assert ck.all_steps() == [1, 3]  # 3 is off the save interval (5): saved for the signal
    state, meta = ck.restore(_State(np.int32(0), np.zeros(2)))
    assert int(state.step) == 3 and meta["cursor"] == 3 and state.w.tolist() == [3.0, 3.0]
    ck.close()
    assert signal.getsignal(signal.SIGTERM) is not None  # the previous handler is back


@pytest.mark.parametrize("how, at, status", [("sigterm", 3, 143), ("sigint", 3, 130),
                                             ("sigint", 1, 130)])
def test_a_signal_ends_the_run_in_one_line_with_the_command_that_goes_on(probe, capsys, how, at,
                                                                        status):
    argv = ["run", NAME, "--out", str(probe), "--set", f"interrupt={how}", "--set", f"at={at}"]
    assert main(argv) == status
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    if at == 1:  # inside step 1, before any checkpoint: start again
        assert "before the first checkpoint" in err
        assert err.endswith(f"jaxrl-suite {' '.join(argv)} --overwrite")
        return
    assert err.endswith(f"jaxrl-suite {' '.join(argv)} --resume")
    if how == "sigterm":
        assert "SIGTERM" in err and "probe step 3 checkpointed" in err
    else:  # inside step 3: the last checkpoint is step 1's
        assert f"the last checkpoints are under {probe / 'checkpoints'}" in err


def test_resume_refuses_a_changed_config_in_one_line(probe, capsys):
    assert main(["run", NAME, "--out", str(probe)]) == 0
    stored = (probe / "config.json").read_text()
    assert json.loads(stored) == {"experiment": NAME, "config": {
        "x": 1, "interrupt": "", "at": 3, "run": {"checkpoint_every": 5}}}
    assert main(["run", NAME, "--out", str(probe), "--resume", "--set", "x=2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "config.json" in err and "x: 1 -> 2" in err
    assert "--overwrite" in err and (probe / "config.json").read_text() == stored
    assert _summary(probe)["resumed"] is False  # the run did not start


def test_resume_may_change_the_listed_fields_and_records_them(probe, capsys):
    assert main(["run", NAME, "--out", str(probe)]) == 0
    assert main(["run", NAME, "--out", str(probe), "--resume",
                 "--set", "run.checkpoint_every=7"]) == 0
    assert "run.checkpoint_every 5 -> 7" in capsys.readouterr().err
    record, = [json.loads(line) for line in (probe / "resumes.jsonl").read_text().splitlines()]
    assert record["changed"] == {"run.checkpoint_every": {"from": 5, "to": 7}}
    stored = json.loads((probe / "config.json").read_text())["config"]
    assert stored["run"]["checkpoint_every"] == 7 and _summary(probe)["resumed"] is True


def test_resume_reads_a_stored_config_whose_keys_moved_since(probe, capsys):
    """A run saved before a key moved (`_Cfg.MOVED`: every -> run.checkpoint_every) resumes:
    the stored config is compared as the config class reads it today; a change is refused."""
    assert main(["run", NAME, "--out", str(probe)]) == 0
    saved = {"experiment": NAME, "config": {"x": 1, "interrupt": "", "at": 3, "every": 5}}
    (probe / "config.json").write_text(json.dumps(saved))
    assert main(["run", NAME, "--out", str(probe), "--resume", "--set", "x=2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "x: 1 -> 2" in err and "every" not in err
    assert main(["run", NAME, "--out", str(probe), "--resume"]) == 0
    assert "resuming with" not in capsys.readouterr().err
    assert not (probe / "resumes.jsonl").exists() and _summary(probe)["resumed"] is True


def test_a_moved_key_is_read_with_a_one_line_warning(probe, capsys):
    assert main(["run", NAME, "--out", str(probe), "--set", "every=7"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("jaxrl-suite: warning: config key 'every' is now "
                          "'run.checkpoint_every' (the old key is still read)\n"), err
    stored = json.loads((probe / "config.json").read_text())["config"]
    assert stored["run"]["checkpoint_every"] == 7 and "every" not in stored
    assert main(["run", NAME, "--out", str(probe), "--overwrite", "--set", "every=7",
                 "--set", "run.checkpoint_every=7"]) == 2
    assert "'every' and 'run.checkpoint_every' are both given" in capsys.readouterr().err


def test_a_grpo_run_saved_with_the_flat_keys_resumes(tmp_path):
    """The grpo section's keys before issue 44 (grpo.sampler, grpo.logprob_chunk, ...) in a
    stored config.json are no change; a change of a moved field still is."""
    exp = load_experiments("grpo_arithmetic").get("grpo_arithmetic")
    record = {"experiment": exp.name, "config": to_dict(
        load_config(exp.config_cls, exp.default_config(), smoke=True))}
    (tmp_path / "config.json").write_text(json.dumps(
        {**record, "config": flat_grpo_keys(record["config"])}))
    assert resume_changes(tmp_path, record, config_cls=exp.config_cls) == {}
    with pytest.raises(ConfigError, match="grpo.draft_k: None -> '<missing>'"):
        resume_changes(tmp_path, record)  # compared as stored
    changed = load_config(exp.config_cls, exp.default_config(),
                          ["grpo.rollout.dtype=bfloat16"], smoke=True)
    with pytest.raises(ConfigError, match=r"grpo.rollout.dtype: None -> 'bfloat16'") as e:
        resume_changes(tmp_path, {**record, "config": to_dict(changed)},
                       config_cls=exp.config_cls)
    assert "\n" not in str(e.value)


def test_an_unwritable_out_is_one_line(probe_yaml, tmp_path, capsys):
    (tmp_path / "file").write_text("not a folder")
    assert main(["run", NAME, "--out", str(tmp_path / "file" / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "is not writable" in err and "file/out" in err


def test_a_run_that_stopped_at_a_bad_config_is_simply_started_again(probe, capsys):
    assert main(["run", NAME, "--out", str(probe), "--set", "x=-1"]) == 2
    assert "x must be >= 0" in capsys.readouterr().err
    assert [p.name for p in probe.iterdir()] == ["config.json"]  # no work to keep
    assert main(["run", NAME, "--out", str(probe)]) == 0


def test_smoke_says_its_numbers_are_meaningless_by_design(probe, capsys):
    assert main(["run", NAME, "--out", str(probe), "--smoke"]) == 0
    out = capsys.readouterr().out
    assert out.count(SMOKE_NOTE) == 1 and "meaningless by design" in SMOKE_NOTE
    assert main(["run", NAME, "--out", str(probe), "--overwrite"]) == 0  # not a smoke run
    assert SMOKE_NOTE not in capsys.readouterr().out
