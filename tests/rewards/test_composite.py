"""The composite screening reward (arXiv 2511.16073) and the reward-hacking guard's report:
hand cases, an independent regex / numpy reference, hostile input, and the detector on a
synthetic collapse and on the GRPO trainer's own metrics."""

import dataclasses
import re

import jax
import numpy as np
import pytest

from jaxrl_suite.algorithms.grpo import GRPOTrainer
from jaxrl_suite.algorithms.grpo_config import GRPOConfig
from jaxrl_suite.core.parallel import make_mesh
from jaxrl_suite.envs.text import ArithmeticTask, Example
from jaxrl_suite.envs.text.base import Verdicts, label_entropy
from jaxrl_suite.envs.text.tokenizer import load_tokenizer
from jaxrl_suite.models import CausalLM, LMConfig
from jaxrl_suite.rewards.composite import (
    COMPONENTS,
    CompositeConfig,
    collapse_report,
    composite_batch,
    composite_components,
    composite_reward,
    exact_format,
    parse_screening,
    predicted_label,
)

CFG = CompositeConfig()
AGGRESSIVE = CompositeConfig(false_selected=4.0)


# ---- hand cases ----
@pytest.mark.parametrize("text, parsed", [
    ("<answer>SELECTED|8|has all, 6y>=5y</answer>", ("SELECTED", 8, "has all, 6y>=5y")),
    ("junk <answer> rejected | 03 |  no sql </answer> more", ("REJECTED", 3, "no sql")),
    ("<answer>SELECTED</answer>", ("SELECTED", None, None)),
    ("<answer>SELECTED|11|x</answer>", ("SELECTED", None, "x")),  # score out of range
    ("<answer>SELECTED|-1|x</answer>", ("SELECTED", None, "x")),
    ("<answer>SELECTED|8|a|b</answer>", ("SELECTED", None, None)),  # extra fields
    ("<answer>MAYBE|8|x</answer>", None),
    ("<answer>SELECTED|8|x", None),  # unclosed
    ("SELECTED|8|x", None),
    ("", None),
])
def test_parse_screening_hand_cases(text, parsed):
    got = parse_screening(text)
    assert (None if got is None else tuple(got)) == parsed
    assert predicted_label(text) == ("invalid" if parsed is None else parsed[0].lower())


@pytest.mark.parametrize("text, ok", [
    ("<answer>SELECTED|8|has all, 6y>=5y</answer>", 1.0),
    ("  <answer>REJECTED|10|no sql</answer>\n", 1.0),
    ("<answer>REJECTED|0|x</answer>", 1.0),
    ("<answer>rejected|2|no sql</answer>", 0.0),  # the decision verbatim
    ("<answer>REJECTED|02|no sql</answer>", 0.0),  # no padding
    ("<answer>REJECTED| 2|no sql</answer>", 0.0),
    ("<answer>REJECTED|2| no sql</answer>", 0.0),  # no surrounding spaces
    ("<answer>REJECTED|2|</answer>", 0.0),  # empty justification
    ("<answer>REJECTED|2|" + "x" * 41 + "</answer>", 0.0),  # too long
    ("<answer>REJECTED|2|" + "x" * 40 + "</answer>", 1.0),
    ("<answer>REJECTED|2|a\nb</answer>", 0.0),  # two lines
    ("<answer>REJECTED|2|no sql</answer> thanks", 0.0),  # text outside
    ("<answer>REJECTED|2|no sql</answer><answer>x</answer>", 0.0),
])
def test_exact_format_hand_cases(text, ok):
    assert exact_format(text) == ok


def test_components_and_reward_hand_cases():
    good = "<answer>SELECTED|8|has all, 6y>=5y</answer>"
    assert composite_components(good, "SELECTED", CFG) == {
        "correct": 1.0, "false_selected": 0.0, "false_rejected": 0.0, "calibration": 1.0,
        "format": 1.0, "length": 0.0}
    assert composite_reward(composite_components(good, "SELECTED", CFG), CFG) == \
        pytest.approx(1.0 + 0.2 + 0.2)
    # a false SELECTED with an uncalibrated score: -4 under the aggressive weighting
    c = composite_components("<answer>SELECTED|3|has all</answer>", "REJECTED", AGGRESSIVE)
    assert (c["correct"], c["false_selected"], c["calibration"], c["format"]) == (0, 1, 0, 1)
    assert composite_reward(c, AGGRESSIVE) == pytest.approx(-4.0 + 0.2)
    # a false REJECTED costs only under a weighting that penalises it
    c = composite_components("<answer>REJECTED|2|no sql</answer>", "SELECTED", CFG)
    assert c["false_rejected"] == 1.0 and c["calibration"] == 1.0
    gentle = CompositeConfig(false_selected=0.25, false_rejected=0.25)
    assert composite_reward(c, gentle) == pytest.approx(-0.25 + 0.2 + 0.2)
    # length: free up to 48 characters, full penalty at 56, linear between
    pad = "<answer>REJECTED|2|no sql</answer>"
    for n, want in ((48, 0.0), (52, 0.5), (56, 1.0), (200, 1.0)):
        text = pad + " " * (n - len(pad))
        assert composite_components(text, "REJECTED", CFG)["length"] == pytest.approx(want)
    # malformed: nothing but the length term
    c = composite_components("x" * 52, "SELECTED", AGGRESSIVE)
    assert c == {"correct": 0.0, "false_selected": 0.0, "false_rejected": 0.0,
                 "calibration": 0.0, "format": 0.0, "length": 0.5}
    assert composite_reward(c, AGGRESSIVE) == pytest.approx(-0.05)


def test_aggressive_weighting_prefers_rejecting_when_unsure():
    """The module docstring's decision rule: a policy with posterior q of "qualified" gains
    by rejecting iff q < (w_C + p_FS) / (2 w_C + p_FS + p_FR); 5/6 for the aggressive weights,
    1/2 for symmetric ones."""
    sel, rej = "<answer>SELECTED|8|has all</answer>", "<answer>REJECTED|2|no sql</answer>"

    def expected(text, q, cfg):
        r = {y: composite_reward(composite_components(text, y, cfg), cfg)
             for y in ("SELECTED", "REJECTED")}
        return q * r["SELECTED"] + (1 - q) * r["REJECTED"]

    for cfg, cut in ((AGGRESSIVE, 5 / 6), (CompositeConfig(false_selected=0.25,
                                                          false_rejected=0.25), 0.5)):
        for q in np.linspace(0.01, 0.99, 41):
            if abs(q - cut) > 1e-6:
                assert (expected(rej, q, cfg) > expected(sel, q, cfg)) == (q < cut), (cfg, q)


def test_config_errors_name_the_field():
    with pytest.raises(ValueError,
                       match="config field 'composite.false_selected' must be >= 0, got -1.0"):
        CompositeConfig(false_selected=-1.0)
    with pytest.raises(ValueError, match="length_free"):
        CompositeConfig(length_free=80, length_max=72)
    with pytest.raises(ValueError, match="calibration_threshold"):
        CompositeConfig(calibration_threshold=11)
    with pytest.raises(ValueError, match="gold decision"):
        composite_components("x", "MAYBE", CFG)


# ---- an independent reference: regexes and a weight vector ----
_REF_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
_REF_EXACT = re.compile(r"\s*<answer>(SELECTED|REJECTED)\|(10|[0-9])\|"
                        r"([^|\s](?:[^|\n\r]{0,38}[^|\s])?)</answer>\s*")


def reference(text: str, gold: str, cfg: CompositeConfig) -> tuple[float, np.ndarray]:
    m = _REF_ANSWER.search(text)
    decision = score = None
    if m:
        parts = m.group(1).split("|")
        if parts[0].strip().upper() in ("SELECTED", "REJECTED"):
            decision = parts[0].strip().upper()
            if len(parts) == 3 and re.fullmatch(r"[0-9]{1,2}", parts[1].strip()) and \
                    int(parts[1].strip()) <= 10:
                score = int(parts[1].strip())
    exact = _REF_EXACT.fullmatch(text)
    exact = exact is not None and "<answer>" not in exact.group(3) and "</answer>" not in \
        exact.group(3)
    x = np.array([
        decision == gold,
        decision == "SELECTED" and gold == "REJECTED",
        decision == "REJECTED" and gold == "SELECTED",
        score is not None and (score >= cfg.calibration_threshold) == (decision == "SELECTED"),
        exact,
        np.clip((len(text) - cfg.length_free) / (cfg.length_max - cfg.length_free), 0, 1),
    ], np.float64)
    w = np.array([cfg.correct, -cfg.false_selected, -cfg.false_rejected, cfg.calibration,
                  cfg.format, -cfg.length])
    return float(w @ x), x


def _corpus(n: int, rng) -> list[str]:
    """Well-formed answers and their corruptions."""
    pieces = ["<answer>", "</answer>", "SELECTED", "REJECTED", "selected", "|", "8", "10", "11",
              "02", "has all, 6y>=5y", "no sql", " ", "\n", "x" * 30, "é", "<", ">"]
    out = []
    for _ in range(n):
        d = rng.choice(["SELECTED", "REJECTED", "Selected", "MAYBE"], p=[0.4, 0.4, 0.1, 0.1])
        s = rng.choice(["8", "2", "10", "6", "5", "02", "x", ""], p=[0.2] * 4 + [0.05] * 4)
        j = rng.choice(["has all, 6y>=5y", "no sql", "", " pad ", "y" * 45],
                       p=[0.4, 0.4, 0.1, 0.05, 0.05])
        text = f"<answer>{d}|{s}|{j}</answer>"
        for _ in range(rng.integers(0, 3) * (rng.random() < 0.5)):  # insert, delete, truncate
            k = rng.integers(0, len(text) + 1)
            op = rng.integers(3)
            if op == 0:
                text = text[:k] + rng.choice(pieces) + text[k:]
            elif op == 1:
                text = text[:k] + text[k + 1:]
            else:
                text = text[:k]
        out.append(text + " " * int(rng.integers(0, 40)) * (rng.random() < 0.3))
    return out


@pytest.mark.parametrize("cfg", [CFG, AGGRESSIVE, CompositeConfig(
    correct=2.0, calibration=0.5, format=1.0, false_selected=0.3, false_rejected=0.7, length=2.0,
    length_free=30, length_max=50, calibration_threshold=5)])
def test_matches_independent_reference(cfg):
    rng = np.random.default_rng(0)
    texts = _corpus(600, rng)
    golds = [str(rng.choice(["SELECTED", "REJECTED"])) for _ in texts]
    rewards, comps = composite_batch(texts, golds, cfg)
    ref = [reference(t, g, cfg) for t, g in zip(texts, golds, strict=True)]
    np.testing.assert_allclose(rewards, [r for r, _ in ref], atol=1e-12)
    np.testing.assert_allclose(np.array([comps[k] for k in COMPONENTS]).T,
                               np.array([x for _, x in ref]), atol=1e-12)
    assert 0.2 < np.mean(comps["format"]) < 0.9  # the corpus has both kinds


def test_hostile_input_never_raises():
    hostile = ["", "<answer>", "</answer><answer>", "<answer>|||||</answer>", "\x00" * 10,
               "<answer>SELECTED|" + "9" * 10_000 + "|x</answer>", "\ud800", "<answer>" * 5000,
               "<answer>SELECTED|８|x</answer>", "<answer>SELECTED|²|x</answer>"]
    for text in hostile:
        c = composite_components(text, "SELECTED", CFG)
        assert all(np.isfinite(v) for v in c.values())
        assert c["format"] == 0.0 and c["calibration"] == 0.0
    # a megabyte with no closing tag: no decision, no format, full length overflow (how fast:
    # benchmarks/bench_hostile.py)
    big = "<answer>SELECTED|8|" + "a|" * 500_000
    assert composite_components(big, "REJECTED", CFG) == {
        "correct": 0.0, "false_selected": 0.0, "false_rejected": 0.0, "calibration": 0.0,
        "format": 0.0, "length": 1.0}


# ---- the collapse report ----
def _records(entropy, selected):
    """Metrics records of a run: the entropy and the class shares of each step."""
    return [{"step": t + 1, "stage": "grpo", "outcome_entropy": float(h),
             **({"outcome_selected": float(s)} if s > 0 else {}),
             **({"outcome_rejected": float(1 - s)} if s < 1 else {})}
            for t, (h, s) in enumerate(zip(entropy, selected, strict=True))]


def _binary_entropy(p):
    p = np.clip(p, 1e-12, 1 - 1e-12)
    return np.where((p <= 1e-12) | (p >= 1 - 1e-12), 0.0, -(p * np.log2(p) + (1 - p) *
                                                            np.log2(1 - p)))


def test_collapse_report_on_a_synthetic_collapse():
    steps = np.arange(100)
    share = 0.5 * np.exp(-steps / 15)  # SELECTED fades: the policy ends up always rejecting
    share[steps >= 70] = 0.0
    h = _binary_entropy(share)
    rep = collapse_report(_records(h, share) + [{"step": 101, "stage": "final"}], 0.5)
    below = h < 0.5
    assert rep["collapsed"] and rep["warned"]
    assert rep["first_step"] == int(np.argmax(below)) + 1
    assert rep["steps_below"] == int(below.sum())
    assert rep["min_entropy"] == pytest.approx(0.0)
    assert rep["window"] == 10 and rep["steps"] == 100
    assert rep["final_entropy"] == pytest.approx(h[-10:].mean())
    assert rep["final_fractions"] == {"selected": 0.0, "rejected": 1.0, "invalid": 0.0}
    assert rep["guard_flags"] is None  # this log has no trainer flags


def test_collapse_report_on_a_healthy_run_and_a_passing_dip():
    rng = np.random.default_rng(1)
    share = np.clip(0.5 + 0.1 * rng.standard_normal(100), 0.05, 0.95)
    h = _binary_entropy(share)
    rep = collapse_report(_records(h, share), 0.5)
    assert not rep["collapsed"] and not rep["warned"] and rep["first_step"] is None
    assert rep["final_fractions"]["selected"] == pytest.approx(share[-10:].mean())
    assert rep["min_entropy"] == pytest.approx(h.min())
    # a dip that recovers: warned, not collapsed
    share[20:25] = 0.0
    rep = collapse_report(_records(_binary_entropy(share), share), 0.5, window=5)
    assert rep["warned"] and not rep["collapsed"]
    assert (rep["first_step"], rep["steps_below"], rep["window"]) == (21, 5, 5)
    assert collapse_report([], 0.5)["steps"] == 0
    with pytest.raises(ValueError, match="threshold"):
        collapse_report([], 0.0)


# ---- the trainer path: GRPO's guard on a batch whose outcomes are one class ----
@dataclasses.dataclass(frozen=True)
class ParityTask(ArithmeticTask):
    """Arithmetic prompts whose verifier labels every completion by the parity of its first
    operand, with a designed reward (completion length) and two components."""

    def verify_batch(self, completions, examples):
        labels = ["selected" if e.meta[0] % 2 else "rejected" for e in examples]
        length = [len(c) / 8 for c in completions]
        return Verdicts(scores=[0.0] * len(completions), outcomes=labels, rewards=length,
                        components={"length": length, "one": [1.0] * len(completions)})


def test_grpo_step_logs_collapse_when_outcomes_are_one_class(capsys):
    model = CausalLM(LMConfig(d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=32))
    params = model.init(jax.random.PRNGKey(0), np.zeros((1, 4), np.int32))
    config = GRPOConfig(prompts_per_step=4, group_size=4, max_new_tokens=8, lr=1e-3,
                        collapse_entropy=0.5)
    trainer = GRPOTrainer(model, load_tokenizer(), ParityTask(digits=1), config,
                          mesh=make_mesh(1), prompt_len=4)
    state = trainer.init_state(params, jax.random.PRNGKey(1))
    one_class = [Example(f"{a}+1=", str(a + 1), (a, 1)) for a in (0, 2, 4, 6)]
    mixed = [Example(f"{a}+1=", str(a + 1), (a, 1)) for a in (1, 2, 3, 4)]
    records = []
    for step, batch in enumerate((one_class, one_class, mixed, one_class), start=1):
        state, m = trainer.step(state, batch)
        records.append({"step": step, "stage": "grpo", **m})
    out = capsys.readouterr().out
    assert [r["collapse"] for r in records] == [1.0, 1.0, 0.0, 1.0]
    assert records[0]["outcome_entropy"] == 0.0 and records[0]["outcome_rejected"] == 1.0
    assert records[2]["outcome_entropy"] == pytest.approx(label_entropy(["a", "b"]))
    assert records[2]["outcome_selected"] == 0.5
    # the warning is printed when a collapse starts: steps 1 and 4, not 2
    assert out.count("WARNING: step") == 2 and "grpo.collapse_entropy=0.5" in out
    for r in records:  # the components' batch means, and the designed reward replaces score
        assert r["reward_one"] == 1.0
        assert r["reward"] == pytest.approx(r["reward_length"], rel=1e-6)
    rep = collapse_report(records, 0.5)
    assert rep["guard_flags"] == rep["steps_below"] == 3 and rep["first_step"] == 1
    assert rep["collapsed"]  # the last step (window 1) is one class
