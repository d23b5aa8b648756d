"""LMTrainer.evaluate_sampled: pass@k / maj@k bookkeeping over n samples per prompt."""

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_suite.algorithms import grpo
from jaxrl_suite.core.parallel import make_mesh
from jaxrl_suite.envs.text import ArithmeticTask
from jaxrl_suite.envs.text.tokenizer import load_tokenizer
from jaxrl_suite.models import CausalLM, LMConfig


def test_evaluate_sampled_groups_samples_per_prompt(monkeypatch):
    tok, task = load_tokenizer(), ArithmeticTask(digits=1)
    examples = task.examples("test", 0, 3)
    right = [task.solution(e) for e in examples]
    assert all(task.is_correct(r, e) for r, e in zip(right, examples, strict=True))
    planned = [  # 4 samples per prompt, in row order
        right[0], "<answer>-1</answer>", "<answer>-1</answer>", "junk",  # c = 1
        "junk", "<answer>-7</answer>", "junk", "junk",                   # c = 0
        right[2], right[2], right[2], right[2],                          # c = 4
    ]
    calls = []

    def fake_sampler(params, prompt, prompt_mask, rng):  # serves the planned texts in order
        start = sum(calls)
        calls.append(prompt.shape[0])
        texts = (planned + ["junk"] * 8)[start : start + prompt.shape[0]]
        ids, mask = tok.encode_batch(texts, 24, side="right", add_eos=True)
        return SimpleNamespace(tokens=jnp.asarray(ids), mask=jnp.asarray(mask))

    monkeypatch.setattr(grpo, "_temperature_sampler", lambda *a: fake_sampler)
    model = CausalLM(LMConfig(d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=32))
    trainer = grpo.LMTrainer(model, tok, task, mesh=make_mesh(1), prompt_len=8,
                             max_new_tokens=24)
    got = trainer.evaluate_sampled(None, examples, n=4, ks=[1, 2, 4], temperature=1.0,
                                   batch_size=5, rng=jax.random.key(0))
    assert calls == [5, 5, 5]  # 12 rows in fixed-size batches, the last one padded
    assert got["pass@1"] == pytest.approx((0.25 + 0 + 1) / 3)
    assert got["pass@2"] == pytest.approx((0.5 + 0 + 1) / 3)  # 1 - C(3,2)/C(4,2) = 0.5
    assert got["pass@4"] == pytest.approx((1 + 0 + 1) / 3)
    assert got["maj@1"] == pytest.approx((1 + 0 + 1) / 3)
    assert got["maj@2"] == pytest.approx((1 + 0 + 1) / 3)  # 1-1 tie: the first answer wins
    assert got["maj@4"] == pytest.approx((0 + 0 + 1) / 3)  # "-1" outvotes the right answer
    assert got["length"] > 0
    with pytest.raises(ValueError, match="ks"):
        trainer.evaluate_sampled(None, examples, n=4, ks=[8], temperature=1.0, batch_size=4,
                                 rng=jax.random.key(0))


def test_evaluate_sampled_runs_the_real_sampler():
    tok, task = load_tokenizer(), ArithmeticTask(digits=1)
    model = CausalLM(LMConfig(d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=32))
    params = model.init(jax.random.PRNGKey(0), np.zeros((1, 8), np.int32))
    trainer = grpo.LMTrainer(model, tok, task, mesh=make_mesh(1), prompt_len=8,
                             max_new_tokens=6)
    got = trainer.evaluate_sampled(params, task.examples("test", 0, 3), n=2, ks=[1, 2],
                                   temperature=1.0, batch_size=4, rng=jax.random.key(1))
    assert set(got) == {"pass@1", "pass@2", "maj@1", "maj@2", "length"}
    assert 0 <= got["pass@1"] <= got["pass@2"] <= 1
    assert 0 < got["length"] <= 6


def test_grpo_arithmetic_reports_sampled_pass_and_maj_at_k(tmp_path):
    import json

    from jaxrl_suite.cli import main

    out = tmp_path / "run"
    argv = ["run", "grpo_arithmetic", "--smoke", "--no-progress", "--out", str(out),
            "--set", "eval.samples=2", "--set", "eval.ks=[1,2]",
            "--set", "eval.sampled_examples=4", "--set", "eval.every=1"]
    assert main(argv) == 0
    final = json.loads((out / "summary.json").read_text())["grpo_sampled_eval"]
    assert set(final) == {"eval_pass@1", "eval_pass@2", "eval_maj@1", "eval_maj@2"}
    assert 0 <= final["eval_pass@1"] <= final["eval_pass@2"] <= 1
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("eval_maj@2" in r and r["stage"] == "grpo" for r in records)  # periodic


def test_sampled_eval_settings_are_checked(tmp_path, capsys):
    from jaxrl_suite.cli import main

    argv = ["run", "grpo_arithmetic", "--smoke", "--out", str(tmp_path),
            "--set", "eval.samples=2", "--set", "eval.ks=[1,4]"]
    assert main(argv) == 2
    assert "eval.ks" in capsys.readouterr().err


def test_cli_eval_scores_a_run_checkpoint(tmp_path, capsys):
    import json

    from jaxrl_suite.cli import main

    out = tmp_path / "run"
    assert main(["run", "grpo_arithmetic", "--smoke", "--no-progress", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["eval", str(out), "--samples", "2", "--ks", "1", "2", "--examples", "4"]) == 0
    printed = json.loads(capsys.readouterr().out)
    saved = json.loads((out / "eval_grpo.json").read_text())
    assert printed == saved
    assert saved["stage"] == "grpo" and saved["step"] >= 1 and saved["examples"] == 4
    assert 0 <= saved["pass@1"] <= saved["pass@2"] <= 1 and 0 <= saved["maj@2"] <= 1
    assert 0 <= saved["greedy_accuracy"] <= 1
    assert main(["eval", str(out), "--stage", "sft", "--samples", "2", "--ks", "1",
                 "--examples", "4"]) == 0
    assert json.loads((out / "eval_sft.json").read_text())["stage"] == "sft"


@pytest.mark.parametrize("argv, message", [
    (["eval", "/nonexistent/run"], "no config.json"),
    (["eval", "RUN", "--samples", "2", "--ks", "4"], "--ks [4]"),
    (["eval", "RUN", "--stage", "ppo"], "--stage"),
])
def test_cli_eval_bad_input_is_one_line(argv, message, tmp_path, capsys):
    import json

    from jaxrl_suite.cli import main

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps(
        {"experiment": "grpo_arithmetic", "config": {"eval": {"num_examples": 8}}}))
    argv = [str(run_dir) if a == "RUN" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
