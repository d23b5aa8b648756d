"""No run deletes data (issue 43): `run` into a folder that holds an earlier run refuses in one
line unless given --resume or --overwrite, and --overwrite moves the earlier run aside."""

import dataclasses
import json

import pytest

from jaxrl_suite.cli import main
from jaxrl_suite.core.experiment import EXPERIMENTS, Experiment

NAME = "outdir_probe"


@dataclasses.dataclass(frozen=True)
class _Cfg:
    x: int = 0


def _probe_run(cfg, opts):
    """What a run leaves: config.json, a checkpoint file, summary.json."""
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    (opts.out_dir / "config.json").write_text(json.dumps({"x": cfg.x}))
    (opts.out_dir / "checkpoints").mkdir(exist_ok=True)
    (opts.out_dir / "checkpoints" / "step").write_text(str(cfg.x))
    (opts.out_dir / "summary.json").write_text(json.dumps({"x": cfg.x, "resumed": opts.resume}))
    return {}


@pytest.fixture(scope="module")
def probe_yaml(tmp_path_factory):
    yaml = tmp_path_factory.mktemp("probe") / "probe.yaml"
    yaml.write_text("x: 1\n")
    if NAME not in EXPERIMENTS:
        EXPERIMENTS.register(NAME, Experiment(NAME, _Cfg, _probe_run, config=yaml))
    return yaml


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
