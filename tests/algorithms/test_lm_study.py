"""`LMStudy.sibling`: a second model of one study, with its own task, lengths, SFT and
tokenizer where given (s3's frozen generator), and the parent's sections otherwise."""

import dataclasses

import pytest

from jaxrl_suite.algorithms.lm_study import LMSections, LMStudy, ModelConfig, SFTConfig
from jaxrl_suite.core.experiment import RunOptions
from jaxrl_suite.envs.text import TASKS
from jaxrl_suite_experiments.grpo_arithmetic import Config

TINY = ModelConfig(vocab_size=512, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32,
                   max_len=96)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    cfg = dataclasses.replace(Config(), model=TINY)
    out = tmp_path_factory.mktemp("study")
    return LMStudy("s", cfg, RunOptions(out_dir=out, progress=False), variants=("a",))


def test_sibling_defaults_to_the_parents_sections(study):
    big = dataclasses.replace(TINY, d_model=32)
    sib = study.sibling(big, ("big",))
    assert isinstance(sib.cfg, LMSections)
    assert sib.cfg.model == big and sib.lm.model.config.d_model == 32
    for name in ("task", "sft", "grpo", "eval", "run"):
        assert getattr(sib.cfg, name) == getattr(study.cfg, name), name
    assert sib.lm.task is study.lm.task
    assert sib.lm.tokenizer.vocab_size == study.lm.tokenizer.vocab_size
    assert list(sib.variants) == ["big"] and sib.out_dir == study.out_dir


def test_sibling_with_its_own_task_lengths_sft_and_tokenizer(study):
    config_json = (study.out_dir / "config.json").read_text()
    task = TASKS.get("sort")()
    sft = SFTConfig(steps=7, batch_size=4)
    sib = study.sibling(TINY, ("reader",), task=task, prompt_len=40, max_new_tokens=40,
                        sft=sft, tokenizer="bpe:300")
    assert sib.lm.task is task
    assert (sib.cfg.task.name, sib.cfg.task.prompt_len) == ("sort", 40)
    assert sib.cfg.grpo.max_new_tokens == 40 and sib.cfg.sft == sft
    assert sib.cfg.run.tokenizer == "bpe:300" and sib.cfg.run.seeds == study.cfg.run.seeds
    # its tokenizer is a BPE trained on the sort task's text, not the parent's bytes
    assert sib.lm.tokenizer.vocab_size == 300 != study.lm.tokenizer.vocab_size
    ex = task.examples("train", 0, 1)[0]
    assert sib.lm.tokenizer.decode(sib.lm.tokenizer.encode(ex.prompt)) == ex.prompt
    # the parent's config.json is not overwritten by the sibling's sections
    assert (study.out_dir / "config.json").read_text() == config_json


def test_a_model_too_big_for_memory_is_one_line_before_any_allocation():
    from jaxrl_suite.algorithms.lm_study import check_memory
    from jaxrl_suite.core.config import ConfigError
    from jaxrl_suite.core.parallel import make_mesh
    from jaxrl_suite.models import CausalLM, LMConfig

    mesh = make_mesh(1)
    check_memory(CausalLM(LMConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=64)),
                 mesh)  # fits
    huge = CausalLM(LMConfig(d_model=65536, n_layers=2, n_heads=64, n_kv_heads=64,
                             d_ff=4 * 65536))
    with pytest.raises(ConfigError, match=r"params: training needs at least [\d,.]+ GiB") as e:
        check_memory(huge, mesh)
    assert "\n" not in str(e.value) and "run.mesh.fsdp" in str(e.value)


def test_labelled_accuracy_by_hand(tmp_path):
    """Greedy and sampled accuracy, overall and per label, on a stub trainer whose completions
    are scripted: greedy right on even rows, sampled right on rows 0 and 3 (4 sampled rows)."""
    from types import SimpleNamespace

    import jax
    import numpy as np

    cfg = dataclasses.replace(Config(), model=TINY)
    cfg = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, sampled_examples=4))
    study = LMStudy("s", cfg, RunOptions(out_dir=tmp_path, progress=False), variants=("a",))
    rows = [SimpleNamespace(i=i, kind="ab"[i % 2], level=i // 3) for i in range(6)]

    def complete(params, examples, *, batch_size, rng=None, temperature=None):
        if rng is None:
            right = [e.i % 2 == 0 for e in examples]
        else:
            assert temperature == cfg.grpo.temperature
            np.testing.assert_array_equal(jax.random.key_data(rng),
                                          jax.random.key_data(study.sampled_key))
            right = [e.i in (0, 3) for e in examples]
        return ["yes" if r else "no" for r in right], np.full(len(examples), 3)

    task = SimpleNamespace(verify_batch=lambda texts, ex: SimpleNamespace(
        scores=[float(t == "yes") for t in texts]))
    out, (texts, lengths, v) = study.labelled_accuracy(
        SimpleNamespace(complete=complete, task=task), None, rows, lambda e: e.kind,
        lambda e: f"L{e.level}")
    # greedy: rows 0, 2, 4 right (all the a's); sampled: rows 0..3, of which 0 (a) and 3 (b)
    assert out == {"greedy_accuracy": 0.5, "acc_a": 1.0, "acc_b": 0.0, "acc_L0": 2 / 3,
                   "acc_L1": 1 / 3, "sampled_accuracy": 0.5, "sampled_a": 0.5,
                   "sampled_b": 0.5, "sampled_L0": 1 / 3, "sampled_L1": 1.0}
    assert texts == ["yes", "no"] * 3 and v.scores == [1.0, 0.0] * 3 and len(lengths) == 6
    greedy, _ = study.labelled_accuracy(SimpleNamespace(complete=complete, task=task), None,
                                        rows, sampled=False)
    assert greedy == {"greedy_accuracy": 0.5}


@pytest.mark.parametrize("accuracy, share, passes", [
    (0.05, 0.25, True), (0.95, 1.0, True),  # both edges are inside
    (0.04, 0.5, False), (0.96, 0.5, False), (0.5, 0.24, False)])
def test_passes_start_rule_by_hand(accuracy, share, passes):
    rule = {"accuracy_band": (0.05, 0.95), "min_nondegenerate": 0.25}
    check = {"sampled_accuracy": accuracy, "nondegenerate_share": share, "mean_reward": 0.0}
    assert LMStudy.passes_start_rule(check, rule) is passes
