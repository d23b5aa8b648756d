"""The rest_rl_code experiment (issue 19) through the CLI at smoke size, and its data steps:
ReST-GRPO's training list and ReST-DPO's pairs from one round of samples."""

import json
import types

import numpy as np
import pytest

from jaxrl_suite.algorithms.rest import (
    DECODERS,
    VARIANTS,
    RestConfig,
    rest_dpo_trainer,
    rest_grpo_task,
)
from jaxrl_suite.cli import main
from jaxrl_suite.core.metrics import read_metrics
from jaxrl_suite.curricula.rest import keep_problem
from jaxrl_suite.envs.text import ExampleList, make_task


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("rest_rl_code")
    assert main(["run", "rest_rl_code", "--smoke", "--no-progress", "--out", str(out)]) == 0
    return out, json.loads((out / "summary.json").read_text())


def test_smoke_run_writes_results(smoke):
    out, summary = smoke
    assert list(summary["variants"]) == list(VARIANTS)
    for name in ("table.md", "decoding.md", "decoding.png", "variance.png"):
        assert (out / name).is_file(), name
    budgets = summary["decoding"]["budgets"]
    decoders = summary["decoding"]["decoders"]
    assert list(decoders) == list(DECODERS)
    for name, row in decoders.items():
        assert len(row["accuracy"]) == (1 if name == "greedy" else len(budgets))
        assert all(0.0 <= a <= 1.0 for a in row["accuracy"])
        if name != "greedy":  # each search spends at least its budget (iterations allowing)
            assert all(t > 0 for t in row["tokens"])
    assert summary["decoding"]["targets"] > 0 and summary["decoding"]["orm_programs"] > 0
    assert summary["best_run"]["variant"] in VARIANTS
    # the SFT start and the continued-SFT control, scored like the runs
    assert set(summary["sft_more"]) == set(summary["sft"])
    rows = [line.split("|")[1].strip() for line in
            (out / "table.md").read_text().splitlines()[2:]]
    assert rows == ["SFT", "SFT continued", *VARIANTS]
    more = [(r["stage"], r["step"]) for r in
            read_metrics(out / "runs" / "sft_more" / "metrics.jsonl")]
    assert more == [("sft_more", 3), ("sft_more", 4)]  # smoke: sft.steps 2, grpo.steps 2


def test_rounds_log_grpo_batches_and_sandbox_outcomes(smoke):
    out, summary = smoke
    for variant in ("grpo", "rest_grpo"):
        recs = [r for r in read_metrics(out / "runs" / f"{variant}_s0" / "metrics.jsonl")
                if r["stage"] == "grpo"]
        assert [r["step"] for r in recs] == [1, 2]  # two rounds of one step, one state
        for r in recs:
            shares = [v for k, v in r.items() if k.startswith("outcome_")]
            assert shares and sum(shares) == pytest.approx(1.0)  # every completion counted
            assert r["reward_var"] >= r["reward_std"] ** 2 - 1e-6  # E[var] >= E[std]^2
    dpo = [r for r in read_metrics(out / "runs" / "rest_dpo_s0" / "metrics.jsonl")
           if r["stage"] == "dpo"]
    assert len(dpo) == 2 and all("dpo_loss" in r for r in dpo)


def test_round_samples_and_filter_stats(smoke):
    out, summary = smoke
    c = RestConfig(problems=4, samples=2)
    for variant in ("rest_grpo", "rest_dpo"):
        kept = []
        for r in range(2):
            data = json.loads((out / "runs" / f"{variant}_s0" / f"round{r}_samples.json")
                              .read_text())
            assert np.shape(data["rewards"]) == (c.problems, c.samples)
            assert np.shape(data["texts"]) == (c.problems, c.samples)
            kept.append(np.mean([keep_problem(x, c.min_std) for x in data["rewards"]]))
        stats = summary["variants"][variant]["filter_kept_fraction"]["per_seed"][0]
        assert stats == pytest.approx(np.mean(kept))


def test_resume_reads_the_same_results(smoke, tmp_path):
    out, summary = smoke
    assert main(["run", "rest_rl_code", "--smoke", "--no-progress", "--resume",
                 "--out", str(out)]) == 0
    again = json.loads((out / "summary.json").read_text())
    assert again["variants"] == summary["variants"]
    assert again["decoding"] == summary["decoding"]


@pytest.fixture(scope="module")
def round_data():
    task = make_task("code", level=2)
    problems = task.examples("train", 0, 3)
    solved = task.solution(problems[0])
    data = {"texts": [[solved, "    return 0\n", "x"], ["a", "b", "c"],
                      ["    return 1\n", task.solution(problems[2]), "y"]],
            "rewards": [[1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.5, 1.0, 0.0]]}
    return task, problems, data


def test_rest_grpo_list(round_data):
    task, problems, data = round_data
    fake = types.SimpleNamespace(with_task=lambda t: t)
    listed = rest_grpo_task(fake, task, problems, data, RestConfig(), seed=0, r=0)
    assert isinstance(listed, ExampleList)
    prompts = [e.prompt for e in listed.train]
    # problem 1 (no variance) is dropped; 0 and 2 stay and add prefixes of their best samples
    assert problems[1].prompt not in prompts
    assert prompts[:2] == [problems[0].prompt, problems[2].prompt]
    partial = listed.train[2:]
    assert partial and all(any(e.prompt.startswith(p.prompt) and e.prompt != p.prompt
                               and e.meta == p.meta for p in (problems[0], problems[2]))
                           for e in partial)
    assert all(e.prompt.endswith("\n") for e in partial)


def test_rest_dpo_pairs(round_data):
    task, problems, data = round_data
    fake = types.SimpleNamespace(task=task, pairs=None, ref_params=None)
    fake.with_task = lambda t: types.SimpleNamespace(**vars(fake))
    trainer = rest_dpo_trainer(fake, problems, data, RestConfig(), params="round start")
    assert [(p.example, p.chosen, p.rejected) for p in trainer.pairs] == [
        (problems[0], data["texts"][0][0], data["texts"][0][1]),
        (problems[2], data["texts"][2][1], data["texts"][2][2])]
    assert trainer.ref_params == "round start" and fake.pairs is None  # a copy
