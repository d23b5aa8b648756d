"""The s3_search experiment (issue 24) through the CLI at smoke size: one run shared by the output
checks, a resumed run, the claim verdicts on synthetic numbers, and config errors. The reward
itself is tested against a scripted reader in tests/envs/test_search.py."""

import dataclasses
import json

import numpy as np
import pytest

from jaxrl_suite.cli import main
from jaxrl_suite.core.metrics import read_metrics
from jaxrl_suite.core.study import seed_stats
from jaxrl_suite.envs.text.search import question_ids
from jaxrl_suite_experiments.s3_search import METRICS, Config, _claims, variant_name

SMOKE = ["--smoke", "--no-progress"]
RUNS = ["gbr_n4", "gbr_n8", "acc_n4", "acc_n8"]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory, module_figures):
    out = tmp_path_factory.mktemp("s3")
    assert main(["run", "s3_search", *SMOKE, "--out", str(out)]) == 0
    return out, json.loads((out / "summary.json").read_text()), module_figures


def test_summary_table_and_figures(smoke):
    out, summary, figs = smoke
    cfg = summary["config"]
    assert list(summary["variants"]) == RUNS
    for stats in summary["variants"].values():
        assert set(stats) == {*METRICS, "wall_time_s"}
        for k in ("success", "sampled_success"):  # greedy, and one episode sampled at grpo T
            assert 0.0 <= stats[k]["mean"] <= 1.0 and len(stats[k]["per_seed"]) == 1
    assert 0.0 <= summary["sft"]["sampled_success"] <= 1.0
    # naive RAG: one generator accuracy per training and held-out question
    naive = json.loads((out / "naive_rag.json").read_text())
    facts = Config().facts.__class__(**cfg["facts"])
    assert len(naive["train"]) == len(question_ids(facts, 0, "train"))
    assert len(naive["test"]) == summary["heldout_examples"] == 3
    assert summary["naive_rag"] == pytest.approx(np.mean(naive["test"]))
    # the GBR pools come from the unsolved training questions before the SFT questions
    rl_candidates = naive["train"][: len(naive["train"]) - cfg["search"]["sft_questions"]]
    assert summary["unsolved_training_questions"] == sum(a == 0 for a in rl_candidates)
    # the SFT demonstrations: the scripted expert searches on most questions
    assert summary["sft"]["demo_reward_queries"] > 0
    assert 0.0 <= summary["generator"]["gold_context_accuracy"] <= 1.0
    table = (out / "table.md").read_text().splitlines()
    assert table[0].startswith("| model | accuracy | sampled accuracy | gain over RAG |")
    assert [row.split("|")[1].strip() for row in table[2:]] == ["naive RAG", "SFT searcher",
                                                                *RUNS]
    (ax,) = figs["accuracy.png"]["axes"]
    assert ax["xscale"] == "log" and ax["legend"] == ["naive RAG", "gbr", "acc"]
    (line,) = [ln for ln in ax["lines"] if ln["label"] == "gbr"]
    np.testing.assert_array_equal(line["x"], [4, 8])
    np.testing.assert_allclose(line["y"], [summary["variants"][f"gbr_n{n}"]["success"]["mean"]
                                           for n in (4, 8)])


def test_runs_log_the_reward_and_its_components(smoke):
    out, summary, _ = smoke
    for run in RUNS:
        recs = [r for r in read_metrics(out / "runs" / f"{run}_s0" / "metrics.jsonl")
                if r["stage"] == "grpo"]
        assert [r["step"] for r in recs] == [1, 2]
        kind = run.split("_n")[0]
        for r in recs:
            for k in ("reward_acc", "reward_acc_naive", "reward_gbr", "reward_recall",
                      "reward_docs", "reward_queries", "turns", "success"):
                assert k in r, (run, k)
            assert r["reward"] == pytest.approx(r["reward_gbr"] if kind == "gbr"
                                                else r["reward_acc"])
            assert r["reward_gbr"] == pytest.approx(r["reward_acc"] - r["reward_acc_naive"])
            if kind == "gbr":  # search.drop_solved: no question naive RAG answers in its pool
                assert r["reward_acc_naive"] == 0.0
        result = json.loads((out / "runs" / f"{run}_s0" / "result.json").read_text())
        assert result["success"] == summary["variants"][run]["success"]["per_seed"][0]


def test_resume_reads_the_finished_study_back(smoke, capsys):
    out, summary, _ = smoke
    capsys.readouterr()
    assert main(["run", "s3_search", *SMOKE, "--out", str(out), "--resume"]) == 0
    printed = capsys.readouterr().out
    assert all(f"{run}_s0: done before" in printed for run in RUNS)
    again = json.loads((out / "summary.json").read_text())
    assert again["variants"] == summary["variants"] and again["resumed"]


def _stats(acc: dict) -> dict:
    return {variant_name(r, n): {"success": seed_stats(v)} for r, by_n in acc.items()
            for n, v in by_n.items()}


def test_claims_follow_the_numbers():
    cfg = Config()
    cfg = dataclasses.replace(cfg, variants=dataclasses.replace(
        cfg.variants, rewards=("gbr", "gbr_acc", "acc", "recall"), sizes=(30, 100, 240)))
    acc = {"gbr": {30: [0.5, 0.6], 100: [0.6, 0.6], 240: [0.7, 0.7]},
           "gbr_acc": {30: [0.4, 0.4], 100: [0.5, 0.5], 240: [0.6, 0.6]},
           "acc": {30: [0.3, 0.3], 100: [0.4, 0.4], 240: [0.5, 0.5]},
           "recall": {30: [0.2, 0.2], 100: [0.3, 0.3], 240: [0.54, 0.54]}}
    c = _claims(cfg, _stats(acc), naive_rag=0.2, sft=0.3)
    assert c["verdict"] == "reproduced" and c["accuracy"]["gbr"][30] == pytest.approx(0.55)
    assert c["gbr_small_vs_baselines_large"] == pytest.approx({"acc": 0.05, "recall": 0.01})
    assert c["gbr_vs_gbr_acc_small"] == pytest.approx(0.15)
    acc["recall"][240] = [0.6, 0.6]  # a baseline at 8x the data beats GBR at the smallest
    assert _claims(cfg, _stats(acc), naive_rag=0.2, sft=0.3)["verdict"] == "partly reproduced"
    assert _claims(cfg, _stats(acc), naive_rag=0.2, sft=0.6)["verdict"] == "not reproduced"


@pytest.mark.parametrize(("override", "field"), [
    ("task.name=facts_qa", "task.name"),
    ("variants.sizes=[1000,300]", "variants.sizes"),
    ("variants.rewards=[f1]", "variants.rewards"),
    ("search.drop_solved=[f1]", "search.drop_solved"),
    ("model.max_len=512", "model.max_len"),
    ("search.unselected=some", "search.unselected"),
    ("generator.max_docs=4", "generator.max_docs"),
])
def test_config_errors_name_the_field(override, field, tmp_path, capsys):
    assert main(["run", "s3_search", "--set", override, "--out", str(tmp_path)]) == 2
    assert field in capsys.readouterr().err


def test_question_pools_split_sft_and_drop_solved_as_the_authors_do():
    from jaxrl_suite.algorithms.s3 import QuestionPools, SearchConfig
    from jaxrl_suite.core.config import ConfigError

    ids = [10, 11, 12, 13, 14, 15, 16, 17]
    solved = [1, 0, 1, 0, 0, 1, 0, 1]
    search = SearchConfig(sft_questions=3, drop_solved=("gbr",))
    pools = QuestionPools(ids, solved, search, largest=3)
    assert pools.sft == [15, 16, 17]  # the last sft_questions
    assert pools.candidates == [10, 11, 12, 13, 14]
    assert pools.unsolved == [11, 13, 14]
    assert pools.pool("gbr", 2) == (11, 13)  # drops what naive RAG answers
    assert pools.pool("acc", 2) == (10, 11)  # as they come
    with pytest.raises(ConfigError, match="variants.sizes"):
        QuestionPools(ids, solved, search, largest=4)
