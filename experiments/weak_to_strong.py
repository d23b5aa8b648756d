"""Weak-to-strong generalisation: pretrained strong students fine-tuned on a weak model's labels.

Claim checked (Burns et al. 2023, "Weak-to-Strong Generalization", arXiv:2312.09390): a strong
student fine-tuned naively on a weak supervisor's labels recovers part of the gap between the
supervisor and the strong ceiling (PGR > 0), and the auxiliary confidence loss recovers much
more.

    jaxrl-suite run weak_to_strong --out results/weak_to_strong   # full size (summary: wall_time_s)
    jaxrl-suite run weak_to_strong --smoke                        # seconds; what the tests run
    jaxrl-suite run weak_to_strong --resume                       # a killed run continues

Per task (`run.tasks`: "screening", the résumé screening task, SELECTED / REJECTED; "dialects",
`envs.text.dialects`, where unlabelled text teaches the word -> class map) the task's train split
is cut into half A, half B and an unlabelled corpus (`algorithms.w2s.make_data`), and per
weak / strong size pair (`run.pairs`, "1x32:2x64" = 1 layer x width 32 : 2 layers x width 64):

  weak      a small LM classifier from scratch, trained on half A's true labels;
  pretrain  the strong LM, next-token prediction on the corpus texts (no labels), once per
            strong size and task, shared by every run below (saved; --resume reads it back);
  ceiling   the pretrained strong model fine-tuned on half B's true labels;
  scratch   the same fine-tuning from random init (how much pretraining helps);
  naive     the pretrained strong model fine-tuned on the weak model's soft labels of half B
            with cross-entropy (`losses.w2s` "xent");
  aux       the same with the auxiliary confidence loss ("logconf").

The seeds of each stage run together in one `jit(vmap(train))` program; weak seed s labels half
B for students of seed s. PGR = (acc_student - acc_weak) / (acc_ceiling - acc_weak) per seed
(test split), reported as median [IQR]. Writes summary.json (accuracies and PGRs per task and
pair, claims with verdicts computed from the medians), table.md, pgr.png (PGR per pair, naive vs
aux, dots: seeds) and accuracy.png; runs/TASK/STAGE/ hold each unit's metrics.jsonl and
result.json, checkpoints/TASK/STAGE/ the pretrained params and the weak labels.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_suite.algorithms import w2s
from jaxrl_suite.algorithms.ppo import seed_keys
from jaxrl_suite.core.checkpoint import load_tree, save_tree
from jaxrl_suite.core.config import (
    Count,
    Seed,
    check_fields,
    to_dict,
)
from jaxrl_suite.core.experiment import Experiment, RunOptions
from jaxrl_suite.core.metrics import WandbConfig
from jaxrl_suite.core.parallel import print0
from jaxrl_suite.core.study import Study, check_seeds, check_variants, seed_stats, verdict
from jaxrl_suite.envs.text import load_tokenizer, make_task
from jaxrl_suite.losses.w2s import performance_gap_recovered
from jaxrl_suite_experiments import CONFIGS

NAME = "weak_to_strong"
TASKS = ("screening", "dialects")
STUDENTS = {"naive": "xent", "aux": "logconf"}  # student -> W2S_LOSSES name
PAPER_CLAIM = ("naive fine-tuning on weak labels recovers part of the gap (PGR > 0); the "
               "auxiliary confidence loss recovers much more")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    tasks: tuple[str, ...] = TASKS
    pairs: tuple[str, ...] = ("1x32:2x64", "1x32:2x128", "1x32:4x128")  # weak:strong sizes
    seeds: tuple[Seed, ...] = (0, 1, 2)  # vmapped in each stage's program
    scratch_ceiling: bool = True  # also fine-tune each strong size from scratch (no pretraining)
    log_every: Count = 25  # training steps per metrics.jsonl record (mean over seeds)
    wandb: WandbConfig = WandbConfig()  # log to W&B as --wandb does (`enabled: true`)

    def __post_init__(self):
        check_fields(self, "run.")  # the Ranges declared above
        check_variants(self.tasks, TASKS, "run.tasks")
        check_seeds(self.seeds)
        if not self.pairs or len(set(self.pairs)) != len(self.pairs):
            raise ValueError(f"run.pairs must be distinct and non-empty, got {list(self.pairs)}")
        for pair in self.pairs:
            w2s.parse_pair(pair)


@dataclasses.dataclass(frozen=True)
class Config:
    screening: w2s.DataConfig = w2s.DataConfig()
    dialects: w2s.DataConfig = w2s.DataConfig(seq_len=40, n_a=256)
    pretrain: w2s.PretrainConfig = w2s.PretrainConfig(steps=1000)
    weak: w2s.TrainConfig = w2s.TrainConfig()  # the weak model, from scratch on half A
    strong: w2s.TrainConfig = w2s.TrainConfig(steps=150, lr=5e-4, warmup=15)  # the rest
    loss: w2s.LossConfig = w2s.LossConfig()
    run: RunConfig = RunConfig()


def _claims(pgr: dict[str, dict[str, dict[str, list[float]]]]) -> dict:
    """Verdicts from per-seed PGRs {task: {pair: {"naive": [S], "aux": [S]}}}: per task and
    pair the medians, "naive PGR > 0" and "aux PGR > naive PGR" (by the medians); overall
    "reproduced" when both hold for every task and pair, "partly reproduced" when either holds
    somewhere, else "not reproduced"."""
    per, holds = {}, []
    for task, pairs in pgr.items():
        per[task] = {}
        for pair, p in pairs.items():
            naive, aux = (float(np.nanmedian(p[s])) for s in ("naive", "aux"))
            c = {"naive_median": naive, "aux_median": aux, "naive_pgr_positive": naive > 0,
                 "aux_above_naive": aux > naive}
            per[task][pair] = c
            holds += [c["naive_pgr_positive"], c["aux_above_naive"]]
    return {"paper": PAPER_CLAIM, "per_pair": per,
            "naive_pgr_positive": all(c["naive_pgr_positive"] for t in per.values()
                                      for c in t.values()),
            "aux_above_naive": all(c["aux_above_naive"] for t in per.values()
                                   for c in t.values()),
            "verdict": verdict(bool(holds) and all(holds), any(holds))}


def _run_task(cfg: Config, study: Study, task_name: str, tok, ids, keys, loss_kw
              ) -> tuple[dict, dict]:
    """One task's units (weak, pretrain, ceiling, pairs): (its summary, its per-seed PGRs)."""
    rc = cfg.run
    weak_sizes = list(dict.fromkeys(w2s.parse_pair(p)[0] for p in rc.pairs))
    strong_sizes = list(dict.fromkeys(w2s.parse_pair(p)[1] for p in rc.pairs))
    dc: w2s.DataConfig = getattr(cfg, task_name)
    t_data = time.perf_counter()
    data = w2s.make_data(make_task(task_name), tok, dc.seq_len, n_corpus=dc.n_corpus,
                         n_a=dc.n_a, n_b=dc.n_b, n_test=dc.n_test)
    print0(f"[{NAME}] {task_name}: data in {time.perf_counter() - t_data:.1f} s")
    A, B, T = data.half_a, data.half_b, data.test
    predictors, programs = {}, {}
    lm = lambda size: w2s.parse_size(size, dc.seq_len)  # noqa: E731

    def test_acc(size, params):
        if size not in predictors:  # one compiled program per size
            predictors[size] = jax.jit(jax.vmap(lambda p, tokens, mask: w2s.predict_proba(
                lm(size), p, tokens, mask, ids), in_axes=(0, None, None)))
        probs = predictors[size](params, T.tokens, T.mask)
        return w2s.accuracy(probs, T.labels).tolist()  # [S]

    def fit(size, tcfg, loss, params0, split, targets):
        """Seeds vmapped: params0 [S, ...] (per seed), targets [S, N, 2]; one compiled
        program per (size, config, loss), shared by the weak model, the ceiling, the
        scratch run and the naive student alike."""
        key = (size, tcfg, loss)
        if key not in programs:
            train = w2s.make_train(tcfg, lm(size), loss, ids, **loss_kw.get(loss, {}))
            programs[key] = jax.jit(jax.vmap(train, in_axes=(0, 0, None, None, 0)))
        return programs[key](keys, params0, split.tokens, split.mask, targets)

    def per_seed(x):
        return jax.tree.map(lambda v: jnp.broadcast_to(v, (len(rc.seeds), *v.shape)), x)

    def template(size):  # the structure of a pretrained checkpoint, to restore into
        return w2s.init_params(lm(size), jax.random.key(0), dc.seq_len)

    def fresh(size, seed_offset):
        return jax.vmap(lambda k: w2s.init_params(lm(size), k, dc.seq_len))(
            jax.random.split(jax.random.key(seed_offset + rc.seeds[0]), len(rc.seeds)))

    def weak_unit(unit):
        size = unit.rsplit("_", 1)[1]
        t = time.perf_counter()
        params, m = fit(size, cfg.weak, "xent", fresh(size, 30_000), A,
                        per_seed(w2s.one_hot_targets(A.labels)))
        labels = jax.jit(jax.vmap(lambda p: w2s.weak_labels(lm(size), p, B, ids)))(params)
        study.checkpoint_dir(unit).mkdir(parents=True, exist_ok=True)
        np.save(study.checkpoint_dir(unit) / "weak_labels.npy", np.asarray(labels))
        study.log_seed_means(unit, {"weak": m}, rc.log_every)
        return {"accuracy": test_acc(size, params),
                "half_b_label_accuracy": w2s.accuracy(labels, B.labels).tolist(),
                "final_loss": np.asarray(m["loss"])[:, -1].tolist(),
                "wall_s": time.perf_counter() - t}

    def pretrain_unit(unit):
        size = unit.rsplit("_", 1)[1]
        t = time.perf_counter()
        pre = w2s.make_pretrain(cfg.pretrain, lm(size))
        params, m = jax.jit(pre)(jax.random.key(10_000 + rc.seeds[0]), data.corpus.tokens,
                                 data.corpus.mask)
        save_tree(study.checkpoint_dir(unit), params)
        study.log_seed_means(unit, {"pretrain": {k: v[None] for k, v in m.items()}}, rc.log_every)
        loss = np.asarray(m["loss"])
        k = max(1, len(loss) // 10)
        return {"nll_start": float(loss[:k].mean()), "nll_end": float(loss[-k:].mean()),
                "wall_s": time.perf_counter() - t}

    def ceiling_unit(unit):
        size = unit.rsplit("_", 1)[1]
        t = time.perf_counter()
        pre = load_tree(study.checkpoint_dir(f"{task_name}/pretrain_{size}"),
                           template(size))
        onehot = per_seed(w2s.one_hot_targets(B.labels))
        params, m = fit(size, cfg.strong, "xent", per_seed(pre), B, onehot)
        result = {"accuracy": test_acc(size, params)}
        stages = {"ceiling": m}
        if rc.scratch_ceiling:
            params, m = fit(size, cfg.strong, "xent", fresh(size, 20_000), B, onehot)
            result["scratch_accuracy"] = test_acc(size, params)
            stages["scratch"] = m
        study.log_seed_means(unit, stages, rc.log_every)
        return {**result, "wall_s": time.perf_counter() - t}

    def pair_unit(unit):
        weak, strong = w2s.parse_pair(unit.split("/", 1)[1].replace("_to_", ":"))
        t = time.perf_counter()
        pre = load_tree(study.checkpoint_dir(f"{task_name}/pretrain_{strong}"),
                           template(strong))
        labels = np.load(study.checkpoint_dir(f"{task_name}/weak_{weak}") /
                         "weak_labels.npy")  # [S, N_B, 2]
        result, stages = {}, {}
        for student, loss in STUDENTS.items():
            params, m = fit(strong, cfg.strong, loss, per_seed(pre), B, labels)
            result[f"{student}_accuracy"] = test_acc(strong, params)
            stages[student] = m
        study.log_seed_means(unit, stages, rc.log_every)
        return {**result, "wall_s": time.perf_counter() - t}

    weak_r = study.run_units([f"{task_name}/weak_{s}" for s in weak_sizes], weak_unit)
    pre_r = study.run_units([f"{task_name}/pretrain_{s}" for s in strong_sizes],
                            pretrain_unit)
    ceil_r = study.run_units([f"{task_name}/ceiling_{s}" for s in strong_sizes],
                             ceiling_unit)
    pair_units = {p: f"{task_name}/{p.replace(':', '_to_')}" for p in rc.pairs}
    pair_r = study.run_units(list(pair_units.values()), pair_unit)

    task_out = {"pairs": {}, "pretrain": {s: pre_r[f"{task_name}/pretrain_{s}"]
                                          for s in strong_sizes},
                "weak": {s: seed_stats(weak_r[f"{task_name}/weak_{s}"]["accuracy"])
                         for s in weak_sizes},
                "ceiling": {}}
    for s in strong_sizes:
        r = ceil_r[f"{task_name}/ceiling_{s}"]
        task_out["ceiling"][s] = {"accuracy": seed_stats(r["accuracy"])}
        if "scratch_accuracy" in r:
            task_out["ceiling"][s]["scratch_accuracy"] = seed_stats(r["scratch_accuracy"])
            task_out["ceiling"][s]["pretraining_gain"] = float(
                np.mean(r["accuracy"]) - np.mean(r["scratch_accuracy"]))
    task_pgr = {}
    for pair, unit in pair_units.items():
        weak, strong = w2s.parse_pair(pair)
        acc = {"weak": weak_r[f"{task_name}/weak_{weak}"]["accuracy"],
               "ceiling": ceil_r[f"{task_name}/ceiling_{strong}"]["accuracy"],
               **{s: pair_r[unit][f"{s}_accuracy"] for s in STUDENTS}}
        pgr = {s: performance_gap_recovered(acc[s], acc["weak"], acc["ceiling"]).tolist()
               for s in STUDENTS}
        task_pgr[pair] = pgr
        task_out["pairs"][pair] = {
            **{f"{k}_accuracy": seed_stats(v) for k, v in acc.items()},
            **{f"pgr_{s}": seed_stats(v) for s, v in pgr.items()},
            "gap": float(np.mean(acc["ceiling"]) - np.mean(acc["weak"]))}
    return task_out, task_pgr


def run(cfg: Config, opts: RunOptions) -> dict:
    t0 = time.perf_counter()
    rc = cfg.run
    study = Study(NAME, opts, variants=list(rc.tasks), seeds=rc.seeds)
    study.write_config(cfg)
    tok = load_tokenizer()
    ids = w2s.label_token_ids(tok)
    keys = seed_keys(rc.seeds)
    loss_kw = {"logconf": dataclasses.asdict(cfg.loss)}  # aux_coef, warmup_frac, ramp
    out: dict[str, dict] = {}
    pgrs: dict[str, dict] = {}
    for task_name in rc.tasks:
        out[task_name], pgrs[task_name] = _run_task(cfg, study, task_name, tok, ids, keys,
                                                    loss_kw)

    claims = _claims(pgrs)
    rows = {f"{t} {p}": {k: v for k, v in r.items() if k != "gap"}
            for t, o in out.items() for p, r in o["pairs"].items()}
    cols = {"weak_accuracy": "weak acc", "ceiling_accuracy": "ceiling acc",
            "naive_accuracy": "naive acc", "aux_accuracy": "aux acc", "pgr_naive": "PGR naive",
            "pgr_aux": "PGR aux"}
    table = study.table(rows, cols, cell="median", formats=dict.fromkeys(cols, ".3f"),
                        label="task weak:strong")
    pre_lines = [f"{t} {s}: pretrained ceiling {c['accuracy']['mean']:.3f}" + (
        f", from scratch {c['scratch_accuracy']['mean']:.3f}" if "scratch_accuracy" in c else "")
        for t, o in out.items() for s, c in o["ceiling"].items()]
    study.plot_bars({name: {"naive": r["pgr_naive"]["per_seed"], "aux": r["pgr_aux"]["per_seed"]}
                     for name, r in rows.items()}, opts.out_dir / "pgr.png", ylabel="PGR",
                    hline=0.0)
    study.plot_bars({name: {k.replace("_accuracy", ""): r[k]["per_seed"] for k in cols
                            if k.endswith("_accuracy")} for name, r in rows.items()},
                    opts.out_dir / "accuracy.png", ylabel="test accuracy", hline=0.5)
    summary = {"config": to_dict(cfg), "tasks": out, "claims": claims,
               "resumed": opts.resume, "wall_time_s": time.perf_counter() - t0}
    print0(f"[{NAME}] accuracies and PGR: median [IQR] over {len(rc.seeds)} seeds; verdict "
           f"{claims['verdict']}")
    text = (f"{table}\nverdict: {claims['verdict']}\n" + "\n".join(pre_lines) + "\n")
    return study.finish(summary, text)


EXPERIMENT = Experiment(
    name=NAME, config_cls=Config, run=run, config=CONFIGS / f"{NAME}.yaml",
    description="weak-to-strong: PGR of naive and confidence-loss students over size pairs",
)
