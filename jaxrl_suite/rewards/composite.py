"""A composite screening reward (decision, score calibration, format, length) and the collapse
report of the reward-hacking guard.

Resume screening with GRPO (Jain et al., "A Mathematical Framework for Custom Reward Functions
in Job Application Evaluation using Reinforcement Learning", arXiv 2511.16073) trains on a
weighted sum of reward components and reports reward hacking under aggressive penalties: the
policy collapses to an "excessively negative" output. A completion answers in one fixed line,

    <answer>DECISION|SCORE|JUSTIFICATION</answer>     e.g. <answer>REJECTED|3|no sql</answer>

with DECISION in {SELECTED, REJECTED}, SCORE an integer 0..10 and a one-line justification.
Against the gold decision y in {S, R}, with the parsed prediction (d, s, j) (`parse_screening`),
the components of completion c are (each in [0, 1], 0 for what does not parse):

    correct         C  = 1[d = y]
    false_selected  FS = 1[d = S and y = R]                  (a false SELECTED: an unqualified hire)
    false_rejected  FR = 1[d = R and y = S]                  (a qualified candidate turned away)
    calibration     K  = 1[s parses and (s >= tau  <=>  d = S)]   (tau = `calibration_threshold`)
    format          F  = 1[c is exactly the fixed line above, with 1 <= |j| <= max_justification
                            characters of one line and no "|"]
    length          L  = clip((|c| - L_free) / (L_max - L_free), 0, 1)    (|c| in characters)

(the length term is DAPO's soft overlong punishment, arXiv 2503.14476, on characters), and the
reward is their weighted sum, penalties subtracted:

    R(c) = w_C C + w_K K + w_F F - p_FS FS - p_FR FR - p_L L

with the weights of a `CompositeConfig`. A completion whose decision does not parse scores
C = FS = FR = K = 0 (and F = 0): it is never worth more than a correct decision, and with
p_FS > 0 it is worth more than a false SELECTED. Asymmetric penalties express the "aggressive"
weightings of the paper: with p_FS >> w_C a policy unsure of a candidate (posterior q of
"qualified") gains by rejecting whenever q < (w_C + p_FS) / (2 w_C + p_FS + p_FR), so a heavy
p_FS pushes an imperfect policy towards always REJECT.

The KL to the SFT model is not a term here: GRPO adds it to the loss, beta * KL_k3(pi || pi_SFT)
(`GRPOConfig.beta`, `losses.policy`), per token, not per completion.

`collapse_report` summarises a run's metrics records for the reward-hacking guard: the GRPO
trainer logs, per step, the entropy of the predicted classes over the batch (bits),

    H_t = -sum_c p_{t,c} log2 p_{t,c}       p_{t,c} = share of step t's completions labelled c

("outcome_entropy", from `Verdicts.outcomes`), and with `grpo.collapse_entropy` = h > 0 a flag
collapse_t = 1[H_t < h] with a printed warning.

Everything here is plain Python on `str`: linear time, never raises on any `str`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Annotated, NamedTuple

from jaxrl_suite.core.config import Count, NonNegative, NonNegativeInt, Range, check_fields
from jaxrl_suite.rewards.format import ANSWER_CLOSE, ANSWER_OPEN, extract_answer, format_reward

SELECTED, REJECTED = "SELECTED", "REJECTED"
DECISIONS = (SELECTED, REJECTED)
# Predicted-class labels (`Verdicts.outcomes`): the decision in lower case, or "invalid".
LABELS = ("selected", "rejected", "invalid")
MAX_SCORE = 10
COMPONENTS = ("correct", "false_selected", "false_rejected", "calibration", "format", "length")


@dataclasses.dataclass(frozen=True)
class CompositeConfig:
    """The weights of the composite reward (module docstring): R = w_C C + w_K K + w_F F
    - p_FS FS - p_FR FR - p_L L. Penalties are magnitudes (>= 0), subtracted."""

    correct: NonNegative = 1.0  # w_C: a right decision
    calibration: NonNegative = 0.2  # w_K: the score agrees with the decision
    format: NonNegative = 0.2  # w_F: the exact one-line format
    false_selected: NonNegative = 0.0  # p_FS: penalty of a false SELECTED (y = REJECTED)
    false_rejected: NonNegative = 0.0  # p_FR: penalty of a false REJECTED (y = SELECTED)
    length: NonNegative = 0.1  # p_L: penalty at full length overflow
    length_free: NonNegativeInt = 48  # L_free: characters without length penalty (< L_max)
    length_max: Count = 56  # L_max: characters at which the length penalty is full
    # tau: SELECTED <-> score >= tau
    calibration_threshold: Annotated[int, Range(ge=1, le=MAX_SCORE)] = 6
    max_justification: Count = 40  # longest justification the format accepts (characters)

    def __post_init__(self):
        check_fields(self, "composite.")  # the Ranges declared above
        if not self.length_free < self.length_max:
            raise ValueError(f"length_free must be < length_max, got "
                             f"{self.length_free} (length_max {self.length_max})")

    def weights(self) -> dict[str, float]:
        """{component: signed weight}: R = sum_k weights[k] * component_k."""
        return {"correct": self.correct, "false_selected": -self.false_selected,
                "false_rejected": -self.false_rejected, "calibration": self.calibration,
                "format": self.format, "length": -self.length}


class Screening(NamedTuple):
    """A parsed screening answer: the decision (SELECTED / REJECTED) and, where they parse, the
    score (0..10, else None) and the stripped justification (else None)."""

    decision: str
    score: int | None
    justification: str | None


def parse_screening(completion: str) -> Screening | None:
    """The first `<answer>` content split on "|": its first field is the decision (stripped,
    upper-cased; None unless SELECTED or REJECTED); the second the score, 1-2 decimal digits
    0..10 (else None); the third the justification (stripped). Extra fields leave the score and
    justification unread. Never raises; linear time."""
    content = extract_answer(completion)
    if content is None:
        return None
    fields = content.split("|")
    decision = fields[0].strip().upper()
    if decision not in DECISIONS:
        return None
    score = justification = None
    if len(fields) == 3:
        raw = fields[1].strip()
        if 1 <= len(raw) <= 2 and raw.isascii() and raw.isdigit() and int(raw) <= MAX_SCORE:
            score = int(raw)
        justification = fields[2].strip()
    return Screening(decision, score, justification)


def predicted_label(completion: str) -> str:
    """The predicted class of a completion: "selected", "rejected" or "invalid" (no decision)."""
    parsed = parse_screening(completion)
    return "invalid" if parsed is None else parsed.decision.lower()


def exact_format(completion: str, *, max_justification: int = 40) -> float:
    """F: 1.0 iff `completion` (surrounding whitespace aside) is exactly one
    `<answer>D|S|J</answer>` with D SELECTED or REJECTED verbatim, S in 0..10 without sign or
    padding, and J a justification of 1..max_justification characters on one line without "|"
    or surrounding spaces."""
    if not format_reward(completion):
        return 0.0
    content = completion.strip()[len(ANSWER_OPEN):-len(ANSWER_CLOSE)]
    fields = content.split("|")
    if len(fields) != 3 or fields[0] not in DECISIONS:
        return 0.0
    score, just = fields[1], fields[2]
    ok_score = 1 <= len(score) <= 2 and score.isascii() and score.isdigit() and \
        str(int(score)) == score and int(score) <= MAX_SCORE
    ok_just = 1 <= len(just) <= max_justification and just == just.strip() and \
        "\n" not in just and "\r" not in just
    return float(ok_score and ok_just)


def length_overflow(completion: str, *, free: int, full: int) -> float:
    """L = clip((|c| - free) / (full - free), 0, 1), |c| the completion's characters."""
    return min(1.0, max(0.0, (len(completion) - free) / (full - free)))


def composite_components(completion: str, gold: str, config: CompositeConfig
                         ) -> dict[str, float]:
    """The components {correct, false_selected, false_rejected, calibration, format, length}
    of `completion` against the gold decision `gold` (SELECTED / REJECTED); see the module
    docstring."""
    if gold not in DECISIONS:
        raise ValueError(f"gold decision must be one of {DECISIONS}, got {gold!r}")
    parsed = parse_screening(completion)
    d = None if parsed is None else parsed.decision
    calibrated = parsed is not None and parsed.score is not None and \
        (parsed.score >= config.calibration_threshold) == (d == SELECTED)
    return {
        "correct": float(d == gold),
        "false_selected": float(d == SELECTED and gold == REJECTED),
        "false_rejected": float(d == REJECTED and gold == SELECTED),
        "calibration": float(calibrated),
        "format": exact_format(completion, max_justification=config.max_justification),
        "length": length_overflow(completion, free=config.length_free, full=config.length_max),
    }


def composite_reward(components: Mapping[str, float], config: CompositeConfig) -> float:
    """R = sum_k weights[k] * components[k] (`CompositeConfig.weights`)."""
    return float(sum(w * components[k] for k, w in config.weights().items()))


def composite_batch(completions: Sequence[str], golds: Sequence[str], config: CompositeConfig
                    ) -> tuple[list[float], dict[str, list[float]]]:
    """(rewards, {component: values}) of a batch, one entry per completion."""
    if len(completions) != len(golds):
        raise ValueError(f"{len(completions)} completions for {len(golds)} gold decisions")
    rows = [composite_components(c, g, config) for c, g in zip(completions, golds, strict=True)]
    return ([composite_reward(r, config) for r in rows],
            {k: [r[k] for r in rows] for k in COMPONENTS})


def collapse_report(records: Sequence[Mapping], threshold: float, *, window: int | None = None,
                    labels: Sequence[str] = LABELS) -> dict:
    """The reward-hacking guard's summary of a run's metrics records.

    Records without "outcome_entropy" (another stage's, an evaluation's) are skipped. Over the
    remaining T steps, with H_t their outcome_entropy (bits) and h = `threshold`:

        steps_below = #{t : H_t < h}          first_step = the first such step (None if none)
        min_entropy = min_t H_t               final_entropy = mean of H_t over the last W steps
        collapsed   = final_entropy < h       (collapsed at the end, not a passing dip)
        warned      = steps_below > 0         (the trainer printed its warning)
        final_fractions[c] = mean over the last W steps of the share "outcome_<c>" (0 where a
                             step logged none of class c)

    with W = `window` (default max(1, T // 10)). "guard_flags" counts the trainer's own
    collapse=1 flags (grpo.collapse_entropy; None when it logged none), which equals steps_below
    when that threshold is h.
    """
    if not threshold > 0:
        raise ValueError(f"collapse threshold must be positive, got {threshold}")
    recs = [r for r in records if "outcome_entropy" in r]
    if not recs:
        return {"threshold": threshold, "steps": 0, "collapsed": False, "warned": False,
                "first_step": None, "steps_below": 0, "min_entropy": None,
                "final_entropy": None, "final_fractions": {}, "window": 0, "guard_flags": None}
    w = max(1, len(recs) // 10) if window is None else max(1, min(window, len(recs)))
    entropy = [float(r["outcome_entropy"]) + 0.0 for r in recs]  # + 0.0: no "-0.0" shown
    steps = [int(r.get("step", i + 1)) for i, r in enumerate(recs)]
    below = [s for s, h in zip(steps, entropy, strict=True) if h < threshold]
    tail = recs[-w:]
    final = sum(entropy[-w:]) / w
    flags = [r["collapse"] for r in recs if "collapse" in r]
    return {
        "threshold": threshold, "steps": len(recs), "collapsed": final < threshold,
        "warned": bool(below), "first_step": below[0] if below else None,
        "steps_below": len(below), "min_entropy": min(entropy), "final_entropy": final,
        "final_fractions": {c: sum(float(r.get(f"outcome_{c}", 0.0)) for r in tail) / w
                            for c in labels},
        "window": w, "guard_flags": int(sum(flags)) if flags else None,
    }


__all__ = ["COMPONENTS", "DECISIONS", "LABELS", "REJECTED", "SELECTED", "CompositeConfig",
           "Screening", "collapse_report", "composite_batch", "composite_components",
           "composite_reward", "exact_format", "length_overflow", "parse_screening",
           "predicted_label"]
