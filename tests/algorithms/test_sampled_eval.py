"""LMTrainer.evaluate_sampled (pass@k / maj@k over n samples per prompt) and the trainers'
samplers: injected `Sampler` objects, one compiled program across temperatures."""

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from lm_helpers import flat_grpo_keys

from jaxrl_suite.algorithms import grpo, grpo_config, sft
from jaxrl_suite.core.parallel import make_mesh
from jaxrl_suite.envs.text import ArithmeticTask
from jaxrl_suite.envs.text.tokenizer import load_tokenizer
from jaxrl_suite.models import CausalLM, LMConfig
from jaxrl_suite.sampling import KVCacheSampler


def test_evaluate_sampled_groups_samples_per_prompt():
    tok, task = load_tokenizer(), ArithmeticTask(digits=1)
    examples = task.examples("test", 0, 3)
    right = [task.solution(e) for e in examples]
    assert all(task.is_correct(r, e) for r, e in zip(right, examples, strict=True))
    planned = [  # 4 samples per prompt, in row order
        right[0], "<answer>-1</answer>", "<answer>-1</answer>", "junk",  # c = 1
        "junk", "<answer>-7</answer>", "junk", "junk",                   # c = 0
        right[2], right[2], right[2], right[2],                          # c = 4
    ]
    calls, settings = [], []

    def fake_sampler(params, prompt, prompt_mask, rng, *, temperature=None, top_p=None):
        start = sum(calls)  # serves the planned texts in order
        calls.append(prompt.shape[0])
        settings.append((temperature, top_p))
        texts = (planned + ["junk"] * 8)[start : start + prompt.shape[0]]
        ids, mask = tok.encode_batch(texts, 24, side="right", add_eos=True)
        return SimpleNamespace(tokens=jnp.asarray(ids), mask=jnp.asarray(mask))

    model = CausalLM(LMConfig(d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=32))
    trainer = sft.LMTrainer(model, tok, task, mesh=make_mesh(1), prompt_len=8,
                             max_new_tokens=24, eval_sampler=fake_sampler)
    got = trainer.evaluate_sampled(None, examples, n=4, ks=[1, 2, 4], temperature=0.7,
                                   top_p=0.9, batch_size=5, rng=jax.random.key(0))
    assert calls == [5, 5, 5]  # 12 rows in fixed-size batches, the last one padded
    assert settings == [(0.7, 0.9)] * 3  # the call's settings reach the sampler
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


def test_evaluate_sampled_runs_the_real_sampler_one_compile_per_shape():
    tok, task = load_tokenizer(), ArithmeticTask(digits=1)
    model = CausalLM(LMConfig(d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=32))
    params = model.init(jax.random.PRNGKey(0), np.zeros((1, 8), np.int32))
    trainer = sft.LMTrainer(model, tok, task, mesh=make_mesh(1), prompt_len=8,
                             max_new_tokens=6)
    assert isinstance(trainer.eval_sampler, KVCacheSampler) and trainer.greedy_sampler.greedy
    for temperature, top_p in [(1.0, 1.0), (0.6, 0.9), (1.4, 1.0)]:
        got = trainer.evaluate_sampled(params, task.examples("test", 0, 3), n=2, ks=[1, 2],
                                       temperature=temperature, top_p=top_p, batch_size=4,
                                       rng=jax.random.key(1))
        assert set(got) == {"pass@1", "pass@2", "maj@1", "maj@2", "length"}
        assert 0 <= got["pass@1"] <= got["pass@2"] <= 1
        assert 0 < got["length"] <= 6
    # temperature and top_p are traced: a new setting reuses the trainer's compiled sampler
    assert trainer.eval_sampler._generate._cache_size() == 1


def test_grpo_trainer_samples_with_the_given_sampler():
    tok, task = load_tokenizer(), ArithmeticTask(digits=1)
    model = CausalLM(LMConfig(d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=32))
    cfg = grpo_config.GRPOConfig(prompts_per_step=2, group_size=2, max_new_tokens=6,
                                 temperature=0.8, top_k=5, top_p=0.9)
    default = grpo.GRPOTrainer(model, tok, task, cfg, mesh=make_mesh(1), prompt_len=8)
    s = default.sampler
    assert (s.temperature, s.top_k, s.top_p, s.max_new_tokens) == (0.8, 5, 0.9, 6)
    assert (s.eos_id, s.pad_id, s.greedy) == (tok.eos_id, tok.pad_id, False)
    seen = []

    def sampler(params, prompt, prompt_mask, rng, **settings):  # the real one, recorded
        seen.append((prompt.shape, rng))
        return s(params, prompt, prompt_mask, rng, **settings)

    trainer = grpo.GRPOTrainer(model, tok, task, cfg, mesh=make_mesh(1), prompt_len=8,
                               sampler=sampler, greedy_sampler=default.greedy_sampler)
    assert trainer.greedy_sampler is default.greedy_sampler  # shared: compiled once
    params = model.init(jax.random.PRNGKey(0), np.zeros((1, 8), np.int32))
    state = trainer.init_state(params, jax.random.key(0))
    key = jax.random.key(3)
    seq, old_logp, rewards, _ = trainer.rollout(state, task.examples("train", 0, 2), key=key)
    assert len(seen) == 1 and seen[0][0] == (4, 8) and seen[0][1] is key
    ref = s(state.params, seq.prompt, seq.prompt_mask, key)  # the same draw
    np.testing.assert_array_equal(seq.completion, ref.tokens)
    np.testing.assert_array_equal(old_logp, ref.logprobs)
    assert rewards.shape == (2, 2)


def test_grpo_arithmetic_reports_sampled_pass_and_maj_at_k(tmp_path):
    import json

    from jaxrl_suite.cli import main

    out = tmp_path / "run"
    argv = ["run", "grpo_arithmetic", "--smoke", "--no-progress", "--out", str(out),
            "--set", "eval.samples=2", "--set", "eval.ks=[1,2]",
            "--set", "eval.sampled_examples=4", "--set", "eval.every=1"]
    assert main(argv) == 0
    final = json.loads((out / "runs" / "grpo_s0" / "result.json").read_text())["sampled"]
    assert set(final) == {"pass@1", "pass@2", "maj@1", "maj@2", "length"}
    assert 0 <= final["pass@1"] <= final["pass@2"] <= 1
    lines = (out / "runs" / "grpo_s0" / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert any("eval_maj@2" in r and r["stage"] == "grpo" for r in records)  # periodic
    last = records[-1]
    assert last["stage"] == "final" and last["eval_pass@2"] == final["pass@2"]


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
    # a run saved before issue 44 (the grpo section's flat keys) is read, with one-line warnings
    stored = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**stored,
                                                 "config": flat_grpo_keys(stored["config"])}))
    assert main(["eval", str(out), "--stage", "sft", "--samples", "2", "--ks", "1",
                 "--examples", "4"]) == 0
    assert "jaxrl-suite: warning: config key 'grpo.sampler' is now 'grpo.rollout.engine' (the " \
        "old key is still read)\n" in capsys.readouterr().err
    assert json.loads((out / "eval_sft.json").read_text())["stage"] == "sft"
    assert main(["eval", str(out), "--seed", "5", "--samples", "2", "--ks", "1"]) == 2
    assert "--seed 5 is not one of run.seeds [0]" in capsys.readouterr().err


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
