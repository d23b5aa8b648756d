"""The Python API (`jaxrl_suite.api`): GRPO and SFT on a user's records and reward functions.

One tiny CausalLM (d_model 32, 1 layer) everywhere; GRPO runs of 3 steps of 2 prompts x 4
completions of 6 tokens. The straight GRPO run (module fixture `straight`) serves the weighted
rewards test and is the reference of the resume test; the SFT run (`sft`) serves the loss test
and starts a GRPO trainer.
"""

import json
import random
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from lm_helpers import flat_grpo_keys

from jaxrl_suite import GRPO, LM, SFT
from jaxrl_suite.api import Rewards, to_example
from jaxrl_suite.core.config import ConfigError
from jaxrl_suite.core.metrics import read_metrics
from jaxrl_suite.models.lora import split_lora

TINY = {"d_model": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "d_ff": 64}
GRPO_CONFIG = {"steps": 3, "prompts_per_step": 2, "group_size": 4, "max_new_tokens": 6,
               "lr": 1e-2}
QUIET = {"progress": False, "eval_config": {"batch_size": 4}}


def problems(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        out.append({"prompt": f"{a}+{b}=", "answer": str(a + b)})
    return out


TRAIN, TEST = problems(12, 0), problems(4, 1)


def correct(completion: str, answer: str) -> float:
    return float(completion.strip() == answer)


def digits(completion: str) -> float:
    return sum(ch.isdigit() for ch in completion) / max(1, len(completion))


def flaky(prompt: str, completion: str) -> float:
    """Raises on an "x", returns NaN on an empty completion, else its length."""
    if "x" in completion:
        raise ValueError("no x please")
    return float("nan") if completion == "" else float(len(completion))


REWARDS, WEIGHTS = [correct, digits, flaky], [1.0, 0.5, 2.0]


def grpo(out_dir, rewards=REWARDS, **kwargs) -> GRPO:
    args = dict(model=LM.small(**TINY), reward_funcs=rewards, reward_weights=WEIGHTS,
                train_prompts=TRAIN, config=GRPO_CONFIG, out_dir=out_dir,
                run_config={"checkpoint_every": 1}, **QUIET)
    return GRPO(**{**args, **kwargs})


def one_line(e) -> str:
    msg = str(e.value)
    assert "\n" not in msg
    return msg


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """A straight 3-step GRPO run with three weighted rewards."""
    return grpo(tmp_path_factory.mktemp("straight") / "out").train()


@pytest.fixture(scope="module")
def sft(tmp_path_factory):
    data = [{"prompt": r["prompt"], "completion": r["answer"]} for r in TRAIN]
    return SFT(model=LM.small(**TINY), train_data=data, config={"steps": 40, "batch_size": 4,
                                                                 "lr": 1e-2, "warmup_steps": 2},
               out_dir=tmp_path_factory.mktemp("sft") / "out", **QUIET).train()


# ---- input forms --------------------------------------------------------------------------
class DatasetLike:
    """What a `datasets.Dataset` offers the API: len, column names and iteration over dicts."""

    def __init__(self, rows):
        self._rows = [dict(r) for r in rows]
        self.column_names = list(self._rows[0])

    def __len__(self):
        return len(self._rows)

    def __iter__(self):
        return (dict(r) for r in self._rows)


def _write_jsonl(path: Path, rows) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")  # a blank line is skipped
    return path


@pytest.mark.parametrize("form", ["list", "jsonl_str", "jsonl_path", "generator", "dataset"])
def test_each_input_form_becomes_exactly_the_train_and_test_splits(form, tmp_path):
    make = {"list": lambda rows, name: list(rows),
            "jsonl_str": lambda rows, name: str(_write_jsonl(tmp_path / f"{name}.jsonl", rows)),
            "jsonl_path": lambda rows, name: _write_jsonl(tmp_path / f"{name}.jsonl", rows),
            "generator": lambda rows, name: (dict(r) for r in rows),
            "dataset": lambda rows, name: DatasetLike(rows)}[form]
    trainer = GRPO(model=LM.small(**TINY), reward_funcs=[correct],
                   train_prompts=make(TRAIN, "train"), eval_prompts=make(TEST, "test"),
                   config=GRPO_CONFIG, out_dir=tmp_path / "out", **QUIET)
    task = trainer.study.lm.task
    epoch = task.examples("train", 0, len(TRAIN))
    # one epoch is every training record once, in a seeded order; nothing is held out
    assert sorted(e.prompt for e in epoch) == sorted(r["prompt"] for r in TRAIN)
    assert [e.prompt for e in epoch] != [r["prompt"] for r in TRAIN]
    assert [(e.prompt, e.answer) for e in task.examples("test", 0, 100)] == \
        [(r["prompt"], r["answer"]) for r in TEST]
    assert [e.prompt for e in trainer.study.held_out] == [r["prompt"] for r in TEST]
    assert trainer.prompt_len == 6  # "47+85=": 6 bytes


def test_a_missing_field_names_the_record_and_the_field(tmp_path):
    rows = [dict(r) for r in TRAIN]
    del rows[2]["answer"]
    with pytest.raises(ConfigError) as e:
        GRPO(model=LM.small(**TINY), reward_funcs=[correct], train_prompts=rows,
             out_dir=tmp_path / "a", **QUIET)
    assert "train_prompts record 2 has no field 'answer'" in one_line(e)
    assert "reward function 'correct'" in str(e.value)
    # a reward that takes no answer needs none
    GRPO(model=LM.small(**TINY), reward_funcs=[digits], train_prompts=rows,
         config=GRPO_CONFIG, out_dir=tmp_path / "b", **QUIET)
    with pytest.raises(ConfigError) as e:
        SFT(model=LM.small(**TINY), train_data=[{"prompt": "1+1=", "completion": "2"},
                                                {"prompt": "1+2="}], out_dir=tmp_path / "c")
    assert "train_data record 1 has no field 'completion' (the SFT target)" in one_line(e)
    with pytest.raises(ConfigError) as e:
        GRPO(model=LM.small(**TINY), reward_funcs=[digits], train_prompts=[{"text": "1+1="}],
             out_dir=tmp_path / "d")
    assert "train_prompts record 0 has no field 'prompt'" in one_line(e)


def test_bad_config_keys_and_inputs_are_one_line(tmp_path):
    def build(**kwargs):
        args = dict(model=LM.small(**TINY), reward_funcs=[correct], train_prompts=TRAIN,
                    out_dir=tmp_path / "x")
        return GRPO(**{**args, **kwargs})

    with pytest.raises(ConfigError) as e:
        build(config={"steps": 2, "group_sise": 4})
    assert "unknown config key 'grpo.group_sise'" in one_line(e)
    with pytest.raises(ConfigError) as e:
        build(config={"group_size": 1})
    assert "grpo.group_size" in one_line(e)
    with pytest.raises(ConfigError) as e:
        build(run_config={"seeds": [1, 2]})
    assert "run.seeds" in one_line(e)
    with pytest.raises(ConfigError) as e:
        build(reward_weights=[1.0, 2.0])
    assert "2 weights for 1 reward functions" in one_line(e)
    with pytest.raises(ConfigError) as e:
        build(train_prompts=tmp_path / "missing.jsonl")
    assert "missing.jsonl" in one_line(e) and "does not exist" in one_line(e)
    with pytest.raises(ConfigError) as e:
        build(model=LM.small(d_modell=8))
    assert "unknown config key 'model.d_modell'" in one_line(e)
    with pytest.raises(ConfigError) as e:
        build(reward_funcs=[lambda prompt, completion, hint: 1.0])
    assert "has no field 'hint'" in one_line(e)


# ---- prompts that do not fit --------------------------------------------------------------
def test_a_prompt_too_long_is_one_line_before_anything_runs(tmp_path):
    rows = TRAIN + [{"prompt": "1234+5678=", "answer": "6912"},
                    {"prompt": "123+456=", "answer": "579"}]
    with pytest.raises(ConfigError) as e:
        GRPO(model=LM.small(**TINY), reward_funcs=[correct], train_prompts=rows, prompt_len=7,
             config=GRPO_CONFIG, out_dir=tmp_path / "out", **QUIET)
    assert "train_prompts: 2 of 14 prompts do not fit prompt_len=7 tokens (the longest has " \
        "10)" in one_line(e)
    assert not (tmp_path / "out").exists()  # nothing written, nothing trained


def test_truncate_left_cuts_the_prompts_to_fit(tmp_path):
    trainer = GRPO(model=LM.small(**TINY), reward_funcs=[correct], train_prompts=TRAIN,
                   prompt_len=4, truncate="left", config=GRPO_CONFIG, out_dir=tmp_path / "o",
                   **QUIET)
    epoch = trainer.study.lm.task.examples("train", 0, len(TRAIN))
    assert sorted(e.prompt for e in epoch) == sorted(r["prompt"][-4:] for r in TRAIN)
    assert sorted(e.answer for e in epoch) == sorted(r["answer"] for r in TRAIN)
    ids, mask = trainer.trainer.encode_prompts(epoch)  # what a rollout encodes
    assert ids.shape == (len(TRAIN), 4) and mask.all()
    # evaluation records are cut the same way
    assert [e.prompt for e in trainer.examples([{"prompt": "123456789", "answer": "1"}])] == \
        ["6789"]
    with pytest.raises(ConfigError, match="truncate must be None or 'left'"):
        GRPO(model=LM.small(**TINY), reward_funcs=[correct], train_prompts=TRAIN,
             truncate="right", out_dir=tmp_path / "r")


# ---- rewards ------------------------------------------------------------------------------
def test_weighted_rewards_on_known_completions(capsys):
    rewards = Rewards(REWARDS, WEIGHTS)
    ex = to_example({"prompt": "47+85=", "answer": "132"})
    v = rewards.verify(["132", "1x2", "", "ab"], [ex] * 4)
    # correct [1, 0, 0, 0]; digits [1, 2/3, 0, 0]; flaky [3, fails, fails (NaN), 2]
    np.testing.assert_allclose(v.rewards, [1 + 0.5 + 2 * 3, 0.5 * 2 / 3, 0.0, 2 * 2])
    assert v.components["correct"] == [1.0, 0.0, 0.0, 0.0]
    np.testing.assert_allclose(v.components["digits"], [1.0, 2 / 3, 0.0, 0.0])
    assert v.components["flaky"] == [3.0, 0.0, 0.0, 2.0]
    assert v.components["flaky_failed"] == [0.0, 1.0, 1.0, 0.0]
    assert v.components["correct_failed"] == [0.0] * 4
    # solved: the reward reaches the sum of the weights, 3.5
    assert v.scores == [1.0, 0.0, 0.0, 1.0]
    out = capsys.readouterr().out
    assert out.count("WARNING: reward function 'flaky'") == 1  # said once
    assert "raised ValueError: no x please" in out
    assert Rewards([correct], solved=2.0).verify(["132"], [ex]).scores == [0.0]


def test_reward_names_are_checked():
    with pytest.raises(ConfigError, match="two functions are named 'correct'"):
        Rewards([correct, correct])
    with pytest.raises(ConfigError, match="reserved"):
        Rewards({"std": correct})
    named = Rewards([lambda completion: 1.0, digits])
    assert named.names == ["reward0", "digits"]


def test_each_weighted_reward_is_logged_by_name(straight):
    records = straight.metrics
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        for name in ("correct", "digits", "flaky"):
            assert f"reward_{name}" in r and f"reward_{name}_failed" in r
        # the logged reward is the weighted sum of the logged components (means are linear)
        np.testing.assert_allclose(
            r["reward"], r["reward_correct"] + 0.5 * r["reward_digits"] + 2 * r["reward_flaky"],
            rtol=1e-5, atol=1e-6)
    assert sum(r["reward_flaky"] for r in records) > 0  # the run saw non-trivial rewards
    assert (straight.out_dir / "checkpoints" / "grpo").is_dir()
    assert json.loads((straight.out_dir / "config.json").read_text())["rewards"] == \
        {"correct": 1.0, "digits": 0.5, "flaky": 2.0}


# ---- resume -------------------------------------------------------------------------------
def test_a_stopped_run_resumes_to_the_straight_runs_params(straight, tmp_path):
    out = tmp_path / "out"
    calls = [0]

    def correct(completion: str, answer: str) -> float:  # the same name as the straight run's
        calls[0] += 1
        if calls[0] > 2 * 8:  # Ctrl-C during the rollout of step 3
            raise KeyboardInterrupt
        return float(completion.strip() == answer)

    with pytest.raises(KeyboardInterrupt):
        grpo(out, rewards=[correct, digits, flaky]).train()
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2]
    with pytest.raises(ConfigError, match="holds an earlier run"):
        grpo(out)  # a fresh run does not mix with it
    with pytest.raises(ConfigError) as e:
        grpo(out, resume=True, reward_weights=[1.0, 0.5, 3.0])
    assert "rewards.flaky: 2.0 -> 3.0" in one_line(e)
    def correct(completion: str, answer: str) -> float:  # noqa: F811 - counted again
        calls[0] += 1
        return float(completion.strip() == answer)

    calls[0] = 0
    # a run saved before issue 44 holds the grpo section's flat keys: the same config
    stored = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**stored,
                                                 "config": flat_grpo_keys(stored["config"])}))
    resumed = grpo(out, resume=True, rewards=[correct, digits, flaky]).train()
    assert calls[0] == 8  # step 3 alone: 2 prompts x 4 completions
    assert [r["step"] for r in resumed.metrics] == [1, 2, 3]
    for a, b in zip(jax.tree.leaves(resumed.params), jax.tree.leaves(straight.params),
                    strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    start = jax.tree.leaves(grpo(tmp_path / "fresh").params)
    assert any(not np.allclose(a, b) for a, b in zip(start, jax.tree.leaves(straight.params),
                                                      strict=True))  # training moved them


# ---- SFT, and GRPO from it ----------------------------------------------------------------
def test_sft_on_prompt_completion_records_lowers_the_loss(sft):
    losses = [r["loss"] for r in sft.metrics if r["stage"] == "sft"]
    assert len(losses) == 40
    assert np.mean(losses[-5:]) < 0.7 * losses[0], losses


def test_grpo_starts_from_the_sft_model(sft, tmp_path):
    trainer = GRPO(model=sft.model, reward_funcs=[correct], train_prompts=TRAIN,
                   config=GRPO_CONFIG, out_dir=tmp_path / "g", **QUIET)
    assert trainer.study.lm.tokenizer is sft.study.lm.tokenizer
    for a, b in zip(jax.tree.leaves(trainer.params), jax.tree.leaves(sft.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_lora_sft_trains_the_adapters_alone(tmp_path):
    data = [{"prompt": r["prompt"], "completion": r["answer"]} for r in TRAIN]
    trainer = SFT(model=LM.small(**TINY).with_lora(rank=2), train_data=data,
                  config={"steps": 2, "batch_size": 4, "lr": 1e-2, "warmup_steps": 0},
                  out_dir=tmp_path / "o", **QUIET)
    start = trainer.params
    trainer.train()
    (base0, ad0), (base1, ad1) = split_lora(start), split_lora(trainer.params)
    assert ad0 and len(jax.tree.leaves(ad0)) == 14
    for a, b in zip(jax.tree.leaves(base0), jax.tree.leaves(base1), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(ad0),
                                                         jax.tree.leaves(ad1), strict=True))


def test_from_pretrained_loads_a_local_checkpoint(tmp_path):
    from jaxrl_suite.envs.text.tokenizer import load_tokenizer
    from jaxrl_suite.models import CausalLM, LMConfig
    from jaxrl_suite.models.hf import save_hf_checkpoint

    cfg = LMConfig(vocab_size=384, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64,
                   qkv_bias=True)
    params = CausalLM(cfg).init(jax.random.PRNGKey(3), np.zeros((1, 4), np.int32))
    texts = [r["prompt"] + r["answer"] for r in TRAIN]
    tok = load_tokenizer("bpe:300", texts=texts)
    save_hf_checkpoint(params, cfg, tmp_path / "hf", tokenizer=tok)
    trainer = GRPO(model=LM.from_pretrained(tmp_path / "hf"), reward_funcs=[correct],
                   train_prompts=TRAIN, config=GRPO_CONFIG, out_dir=tmp_path / "o", **QUIET)
    assert trainer.study.lm.pretrained and trainer.study.lm.model.config.qkv_bias
    # the checkpoint's tokenizer, the one it was saved with, measures the prompts
    assert trainer.prompt_len == max(len(tok.encode(r["prompt"])) for r in TRAIN)
    assert [trainer.tokenizer.encode(r["prompt"]) for r in TRAIN] == \
        [tok.encode(r["prompt"]) for r in TRAIN]
    for a, b in zip(jax.tree.leaves(trainer.params), jax.tree.leaves(params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b))
    with pytest.raises(ConfigError, match="'d_model' comes from the checkpoint"):
        LM.from_pretrained(tmp_path / "hf", d_model=64)
    with pytest.raises(ConfigError, match="LM.from_pretrained"):
        GRPO(model=LM.from_pretrained(tmp_path / "nowhere"), reward_funcs=[correct],
             train_prompts=TRAIN, out_dir=tmp_path / "n")


# ---- evaluation ---------------------------------------------------------------------------
def test_evaluate_on_a_hand_checkable_case(tmp_path):
    """Rewards that do not depend on the completion: 3 of 4 records say "yes", so 3 of 4 are
    solved greedy and sampled alike, and the mean reward is 3/4 + 2 x 0.5."""

    def yes(answer: str) -> float:
        return float(answer == "yes")

    def half() -> float:
        return 0.5

    records = [{"prompt": f"q{i}?", "answer": a} for i, a in enumerate(["yes", "no", "yes",
                                                                          "yes"])]
    trainer = GRPO(model=LM.small(**TINY), reward_funcs=[yes, half], reward_weights=[1.0, 2.0],
                   solved_reward=2.0, train_prompts=records, config=GRPO_CONFIG,
                   out_dir=tmp_path / "o", **QUIET)
    with pytest.raises(ConfigError, match="no eval records"):
        trainer.evaluate()
    out = trainer.evaluate(records)
    assert out == {"greedy_accuracy": 0.75, "sampled_accuracy": 0.75, "mean_reward": 1.75,
                   "examples": 4}


def test_import_jaxrl_suite_is_cheap():
    """The API is exported lazily: `import jaxrl_suite` loads no JAX (this module's own
    `from jaxrl_suite import GRPO, LM, SFT` checks the export)."""
    code = "import sys, jaxrl_suite; print('jax' in sys.modules, sorted(jaxrl_suite.__all__))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.split("\n")[0] == "False ['GRPO', 'LM', 'SFT', '__version__']"
    assert GRPO.__module__ == "jaxrl_suite.api"


# ---- docs/api.md ----------------------------------------------------------------------------
DOC_SMOKE = {  # docs/api.md's examples at a smoke size: (text in the doc, its stand-in)
    "LM.small()": f"LM.small(**{TINY!r})",
    "range(1000)": "range(16)",
    "range(2000)": "range(16)",
    "range(200)": "range(4)",
    '"steps": 200': '"steps": 2, "prompts_per_step": 2',
    '"steps": 1200, "schedule_steps": 1200': '"steps": 3, "schedule_steps": 3',
    '"steps": 100': '"steps": 2, "prompts_per_step": 2',
}


def test_the_docs_examples_run_as_written_at_a_smoke_size(tmp_path, monkeypatch, capsys):
    import re
    import tempfile

    text = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 2
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the default out_dirs
    for block in blocks:
        for old, new in DOC_SMOKE.items():
            block = block.replace(old, new)
        assert "range(4)" in block and '"steps": 2' in block  # the substitutions happened
        exec(compile(block, "docs/api.md", "exec"), {"__name__": "docs_api"})
    out = capsys.readouterr().out
    assert out.count("'greedy_accuracy': ") == 3 and "GRPO: {" in out
