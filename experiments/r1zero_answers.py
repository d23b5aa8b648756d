"""What the R1-Zero base answers on its start rule's TRAINING questions (never the held-out set):
the rule's own samples, decoded and sorted into kinds, to see why a start fails (docs/r1zero.md).

    python -m jaxrl_suite_experiments.r1zero_answers RUN_DIR [--step N] [--smoke]

RUN_DIR is an r1zero_spatial run with a pretraining checkpoint; its shipped config (the smoke
config with --smoke; the config is read the way the run read it) gives the questions, G and the
key, so the accuracy printed is the rule's at that checkpoint. Writes RUN_DIR/answers_STEP.json:
one row per sample (category, options, answer, kind, score); prints the tally per category and
kind: an offered option, or else a number, a direction word, a colour, a shape, an object name,
other, or no answer.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from pathlib import Path

import numpy as np

from jaxrl_suite.algorithms import lm_study as kit
from jaxrl_suite.algorithms.sft import VALIDATION_START, SFTTrainer
from jaxrl_suite.core.checkpoint import CheckpointNotFoundError
from jaxrl_suite.core.config import ConfigError, load_config
from jaxrl_suite.core.experiment import RunOptions
from jaxrl_suite.envs import vision
from jaxrl_suite.rewards.format import extract_answer
from jaxrl_suite_experiments import r1zero_spatial

DIRECTIONS = ("left", "right", "above", "below")


def kind_of(answer: str | None, options) -> str:
    """The kind of an answer (module docstring)."""
    if answer is None:
        return "no answer"
    if answer in options:
        return "option"
    if re.fullmatch(r"\d+", answer):
        return "number"
    if answer in DIRECTIONS:
        return "direction"
    if answer in vision.OBJECT_COLOURS:
        return "colour"
    if answer in vision.SHAPES:
        return "shape"
    words = answer.split()
    if len(words) == 2 and words[0] in vision.OBJECT_COLOURS and words[1] in vision.SHAPES:
        return "object name"
    return "other"


def answers(run_dir: Path, *, step: int | None = None, smoke: bool = False) -> dict:
    """The rule's samples at pretraining checkpoint `step` (default: the latest), decoded."""
    run_dir = run_dir.absolute()
    cfg = load_config(r1zero_spatial.Config, r1zero_spatial.EXPERIMENT.default_config(), [],
                      smoke=smoke)
    task, p = r1zero_spatial.spatial(cfg, "think"), cfg.pretrain
    study = kit.LMStudy(r1zero_spatial.NAME, cfg, RunOptions(out_dir=run_dir, progress=False),
                        variants=cfg.variants.names, task=task)
    pre = SFTTrainer(study.lm.model, study.lm.tokenizer, vision.PretrainTask(max_chars=p.max_chars),
                     kit.SFTConfig(steps=p.steps, batch_size=p.batch_size), mesh=study.lm.mesh,
                     prompt_len=p.prompt_len, max_new_tokens=p.max_chars + 1)
    template = pre.init_state(study.lm.init_params(study.start_seed), kit.lm_keys(0).sft)
    state = study.restore(pre, template, run_dir / "checkpoints" / "pretrain", step=step,
                          what="r1zero_answers")
    flat, texts, v = study.group_samples(study.lm_trainer(task), state.params, task.examples(
        "train", VALIDATION_START, p.check_examples))  # the start rule's own samples
    scores = v.scores
    rows = [{"category": e.meta.category, "options": list(e.meta.options),
             "answer": extract_answer(t), "kind": kind_of(extract_answer(t), e.meta.options),
             "score": float(s)} for t, e, s in zip(texts, flat, scores, strict=True)]
    return {"step": int(state.step), "accuracy": float(np.mean(scores)), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--step", type=int, default=None, help="a pretraining checkpoint step")
    ap.add_argument("--smoke", action="store_true", help="the run used --smoke")
    a = ap.parse_args(argv)
    try:
        out = answers(a.run_dir, step=a.step, smoke=a.smoke)
    except (CheckpointNotFoundError, ConfigError) as e:  # one line naming what is missing
        print(f"r1zero_answers: {e}", file=sys.stderr)
        return 2
    (a.run_dir / f"answers_{out['step']}.json").write_text(json.dumps(out, indent=1))
    print(f"pretraining step {out['step']}: the rule's sampled accuracy {out['accuracy']:.3f}")
    tally = collections.Counter((r["category"], r["kind"]) for r in out["rows"])
    for (category, kind), n in sorted(tally.items()):
        print(f"  {category:9} {kind:12} {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
