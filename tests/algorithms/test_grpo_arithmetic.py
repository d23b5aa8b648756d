"""End-to-end tests of the GRPO experiment through the CLI at smoke size."""

import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxrl_suite.algorithms.grpo import GRPOTrainer
from jaxrl_suite.algorithms.sft import SFTTrainer
from jaxrl_suite.cli import SMOKE_NOTE, main
from jaxrl_suite.core import metrics
from jaxrl_suite.core.checkpoint import Checkpointer
from jaxrl_suite.core.config import load_config
from jaxrl_suite.core.metrics import read_metrics
from jaxrl_suite.core.parallel import make_mesh
from jaxrl_suite.envs.text import make_task
from jaxrl_suite.envs.text.tokenizer import load_tokenizer
from jaxrl_suite.models import CausalLM
from jaxrl_suite_experiments.grpo_arithmetic import Config

SMOKE = ["--smoke", "--no-progress"]
CONFIG = Path(__file__).resolve().parents[2] / "configs" / "grpo_arithmetic.yaml"


RUN = Path("runs") / "grpo_s0"  # seed 0's run of the study (the smoke size has one seed)
CKPT = Path("checkpoints") / "grpo_s0"


def _grpo_params(out_dir, cfg):
    """Params of seed 0's latest GRPO checkpoint in `out_dir`."""
    model = CausalLM(cfg.model)
    params = model.init(jax.random.PRNGKey(0), np.zeros((1, cfg.task.prompt_len), np.int32))
    trainer = GRPOTrainer(model, load_tokenizer(), make_task("arithmetic"), cfg.grpo,
                          mesh=make_mesh(1), prompt_len=cfg.task.prompt_len)
    template = trainer.init_state(params, jax.random.PRNGKey(0))
    state, meta = Checkpointer(out_dir / CKPT / "grpo").restore(template)
    return state, meta


def test_smoke_run_writes_results(tmp_path, capsys, figures):
    assert main(["run", "grpo_arithmetic", *SMOKE, "--out", str(tmp_path), "--tensorboard"]) == 0
    out = capsys.readouterr().out
    assert "SFT steps, held-out greedy" in out and "held-out greedy after GRPO" in out
    assert out.rstrip().splitlines()[-1] == SMOKE_NOTE  # below the (meaningless) results
    assert "after continued SFT" in out
    summary = json.loads((tmp_path / "summary.json").read_text())
    seed0 = json.loads((tmp_path / RUN / "result.json").read_text())
    # the start's figures (greedy, sampled, per-digit loss) and the continued-SFT control
    assert seed0["sft_steps"] == 3  # the smoke start never reaches the stop accuracy
    assert set(summary["sft_place_loss"]["seed 0"]) == {"units", "tens", "hundreds"}
    assert all(v > 0 for v in summary["sft_place_loss"]["seed 0"].values())
    for key in ("sft_sampled", "grpo_sampled", "sft_more_accuracy", "sft_more_sampled"):
        assert 0.0 <= seed0[key] <= 1.0, key
    more = read_metrics(tmp_path / "runs" / "sft_more_s0" / "metrics.jsonl")
    assert [r["step"] for r in more] == [4, 5] and {r["stage"] for r in more} == {"sft_more"}
    sft = [r for r in read_metrics(tmp_path / RUN / "metrics.jsonl") if r["stage"] == "sft"]
    assert [r["step"] for r in sft if "val_accuracy" in r] == [1, 2, 3]  # sft.stop_every: 1
    assert summary["grpo_heldout_accuracy"] == seed0["grpo_accuracy"]  # one seed: its mean
    assert summary["variants"]["grpo"]["gain"]["per_seed"] == [seed0["gain"]]
    assert seed0["gain"] == pytest.approx(seed0["grpo_accuracy"] - seed0["sft_accuracy"])
    assert 0.0 <= summary["grpo_heldout_accuracy"] <= 1.0 and summary["wall_time_s"] > 0
    assert "| seed 0 |" in (tmp_path / "table.md").read_text()
    records = read_metrics(tmp_path / RUN / "metrics.jsonl")
    grpo = [r for r in records if r["stage"] == "grpo"]
    assert len(grpo) == 2
    for key in ("reward", "accuracy", "length", "entropy", "kl", "clip_frac", "grad_norm",
                "param_norm", "update_norm", "tokens_per_s", "kept_frac", "draws", "filled"):
        assert np.isfinite(grpo[-1][key]), key
    assert (tmp_path / "reward_curve.png").stat().st_size > 1000
    axes = figures["reward_curve.png"]["axes"]  # one panel per key; each plots the GRPO records
    assert [ax["title"] for ax in axes[:3]] == ["reward (grpo)", "accuracy (grpo)",
                                                "length (grpo)"]
    for ax, key in zip(axes, ("reward", "accuracy", "length"), strict=False):
        (line,) = ax["lines"]
        np.testing.assert_allclose(line["y"],
                                   metrics.trailing_mean([r[key] for r in grpo], 10))
    assert list((tmp_path / RUN / "tensorboard").glob("events.*"))


def test_resume_after_kill_matches_straight_run(tmp_path):
    cfg_set = ["--set", "grpo.steps=6", "--set", "run.checkpoint_every=2",
               "--set", "run.keep_checkpoints=3"]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert main(["run", "grpo_arithmetic", *SMOKE, *cfg_set, "--out", str(straight)]) == 0
    assert main(["run", "grpo_arithmetic", *SMOKE, *cfg_set, "--out", str(killed)]) == 0
    # As if killed before it saved GRPO step 6 (all 6 steps logged), with step 4's arrays cut
    # short (a torn write, a full disk): resuming must fall back to step 2 (issue 43) and redo
    # steps 3-6.
    shutil.rmtree(killed / CKPT / "grpo" / "6")
    for f in (killed / CKPT / "grpo" / "4").rglob("*"):
        if f.is_file() and f.parent.name == "d":
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    (killed / "summary.json").unlink()
    (killed / RUN / "result.json").unlink()  # a killed run never wrote its result
    assert main(["run", "grpo_arithmetic", *SMOKE, *cfg_set, "--out", str(killed),
                 "--resume"]) == 0
    assert (killed / CKPT / "grpo.corrupt" / "4").is_dir()  # moved aside, not deleted

    cfg = load_config(Config, CONFIG, ["grpo.steps=6"], smoke=True)
    a, meta_a = _grpo_params(straight, cfg)
    b, meta_b = _grpo_params(killed, cfg)
    assert int(a.step) == int(b.step) == 6 and meta_a["cursor"] == meta_b["cursor"]
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6),
                 a.params, b.params)
    steps = [r["step"] for r in read_metrics(killed / RUN / "metrics.jsonl")
             if r["stage"] != "final"]
    assert steps == list(range(1, cfg.sft.steps + 7))  # every step exactly once
    rec_a = [r for r in read_metrics(straight / RUN / "metrics.jsonl") if r["stage"] == "grpo"]
    rec_b = [r for r in read_metrics(killed / RUN / "metrics.jsonl") if r["stage"] == "grpo"]
    np.testing.assert_allclose([r["reward"] for r in rec_a], [r["reward"] for r in rec_b])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "no_such_experiment"], "unknown experiment 'no_such_experiment'"),
        (["run", "grpo_arithmetic", "--set", "grpo.lrr=1"], "unknown config key 'grpo.lrr'"),
        (["run", "grpo_arithmetic", "--set", "grpo.steps=abc"], "'grpo.steps'"),
        (["run", "grpo_arithmetic", "--set", "grpo.loss_type=ppo"], "'grpo.loss_type'"),
        (["run", "grpo_arithmetic", "--resume", "--out", "{tmp}/none"], "no checkpoint found"),
        (["run", "grpo_arithmetic", "--config", "{tmp}/nope.yaml"], "config file not found"),
        (["run", "grpo_arithmetic", "--smoke", "--set", "sft.batch_size=0"],
         "config field 'sft.batch_size' must be >= 1, got 0"),
        (["run", "grpo_arithmetic", "--set", "grpo.group_size=1"],
         "config field 'grpo.group_size' must be >= 2, got 1"),
        (["run", "grpo_arithmetic", "--smoke", "--set", "run.mesh.tensor=3"],
         "run.mesh {data: -1, fsdp: 1, tensor: 3}: the fixed axes (3 devices) do not divide"),
        (["run", "grpo_arithmetic", "--smoke", "--set", "run.mesh.fsdp=-1"],
         "-1 for at most one axis"),
        (["run", "grpo_arithmetic", "--smoke", "--set", "grpo.max_new_tokens=8"],
         "'grpo.max_new_tokens'"),
        (["run", "grpo_arithmetic", "--smoke", "--set", "run.tokenizer=bpe:many"],
         "config field 'run.tokenizer': tokenizer 'bpe:many': expected 'bpe:<vocab size>'"),
        (["run", "grpo_arithmetic", "--smoke", "--set", "run.tokenizer=bpe:512"],
         "config field 'model.vocab_size' (384) is smaller than the tokenizer's vocabulary"),
        # issue 43's cases: each one line, before anything is compiled or written
        (["run", "grpo_arithmetic", "--set", "grpo.lr=nan"],
         "config field 'grpo.lr' must be finite, got nan"),
        (["run", "grpo_arithmetic", "--set", "grpo.lr=-inf"], "'grpo.lr' must be finite"),
        (["run", "grpo_arithmetic", "--set", "grpo.lr=-1e-4"], "'grpo.lr' must be >= 0"),
        (["run", "grpo_arithmetic", "--set", "grpo.steps=-5"], "'grpo.steps' must be >= 1"),
        (["run", "grpo_arithmetic", "--set", "grpo.beta=-0.1"], "'grpo.beta' must be >= 0"),
        (["run", "grpo_arithmetic", "--set", "grpo.clip_eps=-0.2"], "'grpo.clip_eps' must be"),
        (["run", "grpo_arithmetic", "--set", "grpo.top_p=5"],
         "config field 'grpo.top_p' must be in (0, 1], got 5.0"),
        (["run", "grpo_arithmetic", "--set", "run.seeds=[1e23]"], "'run.seeds[0]' expects int"),
        (["run", "grpo_arithmetic", "--set", "run.seeds=[100000000000000000000000]"],
         "'run.seeds[0]' must be in [0, 4.29497e+09)"),
        (["run", "grpo_arithmetic", "--smoke", "--out", "{tmp}/big", "--set",
          "model.d_model=65536"], "GiB (params, reference, gradients, AdamW moments)"),
        (["run", "grpo_arithmetic", "--smoke", "--out", "/proc/x"], "--out /proc/x is not "
                                                                     "writable"),
    ],
)
def test_bad_input_is_one_line_exit_2(argv, message, tmp_path, capsys):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err


def test_list(capsys):
    assert main(["list"]) == 0
    assert "grpo_arithmetic" in capsys.readouterr().out


def test_batches_must_split_over_devices():
    from jaxrl_suite.algorithms.lm_study import check_batches
    from jaxrl_suite.core.config import ConfigError

    cfg = load_config(Config, CONFIG, ["grpo.prompts_per_step=3", "grpo.group_size=2"])
    check_batches(cfg, 2)
    with pytest.raises(ConfigError, match="'grpo.prompts_per_step' gives 6 rows"):
        check_batches(cfg, 4)


def test_run_from_a_local_hf_checkpoint(tmp_path, capsys):
    """`--set model.hf_path=DIR` starts SFT from the checkpoint's weights, sizes and tokenizer
    (here a Qwen2-layout model saved by save_hf_checkpoint with sizes unlike --smoke's)."""
    from jaxrl_suite.models import LMConfig
    from jaxrl_suite.models.hf import save_hf_checkpoint

    hf_cfg = LMConfig(d_model=48, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=96, qkv_bias=True)
    hf_params = CausalLM(hf_cfg).init(jax.random.PRNGKey(7), np.zeros((1, 6), np.int32))
    save_hf_checkpoint(hf_params, hf_cfg, tmp_path / "hf", tokenizer=load_tokenizer())
    argv = ["run", "grpo_arithmetic", *SMOKE, "--out", str(tmp_path / "run"),
            "--set", f"model.hf_path={tmp_path / 'hf'}", "--set", "sft.lr=0.0"]
    assert main(argv) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["config"]["model"]["hf_path"] == str(tmp_path / "hf")
    # with a zero SFT learning rate the SFT checkpoint holds the HF weights unchanged
    sft = SFTTrainer(CausalLM(hf_cfg), load_tokenizer(), make_task("arithmetic"), Config().sft,
                     mesh=make_mesh(1), prompt_len=6, max_new_tokens=22)
    template = sft.init_state(jax.tree.map(np.zeros_like, hf_params), jax.random.PRNGKey(0))
    state, _ = Checkpointer(tmp_path / "run" / CKPT / "sft").restore(template)
    for a, b in zip(jax.tree.leaves(hf_params), jax.tree.leaves(state.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    assert main(["run", "grpo_arithmetic", *SMOKE, "--out", str(tmp_path / "bad"),
                 "--set", f"model.hf_path={tmp_path / 'nowhere'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "config field 'model.hf_path'" in err and "does not exist" in err and "\n" not in err


def test_run_on_a_local_jsonl_task(tmp_path):
    """`--set task.name=jsonl --set task.path=F` trains and evaluates on the file's problems."""
    rows = [{"prompt": f"{a}*{b}=", "answer": a * b} for a in range(10) for b in range(10)]
    path = tmp_path / "mul.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["run", "grpo_arithmetic", *SMOKE, "--out", str(tmp_path / "run"),
            "--set", "task.name=jsonl", "--set", f"task.path={path}"]
    assert main(argv) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["config"]["task"]["path"] == str(path)
    assert 0.0 <= summary["grpo_heldout_accuracy"] <= 1.0


@pytest.mark.parametrize(
    "sets, message",
    [(["task.data_dir=/x"], "config field 'task.data_dir' does not apply to task 'arithmetic'"),
     (["task.name=jsonl"], "config section 'task' (jsonl): jsonl: pass path="),
     (["task.name=jsonl", "task.path={tmp}/none.jsonl"], "none.jsonl"),
     (["task.name=gsm8k", "task.data_dir={tmp}"], "TFDS dataset 'gsm8k' is not prepared in")],
)
def test_bad_task_sections_are_one_line_exit_2(sets, message, tmp_path, capsys):
    argv = ["run", "grpo_arithmetic", *SMOKE, "--out", str(tmp_path / "run")]
    for s in sets:
        argv += ["--set", s.replace("{tmp}", str(tmp_path))]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err
