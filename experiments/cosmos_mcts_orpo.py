"""COS(M+O)S on a checkable story world: MCTS over plot steps guided by a curiosity-and-coherence
value model, then iterated ORPO on the search's high- vs low-value expansions (Materzok 2025,
arXiv 2501.17104).

Claim checked: search + ORPO brings a small policy close to the single-pass plot quality of a
model several times larger (the paper: Llama 3.2 3B within 0.06 SD of Llama 3.1 70B).

    jaxrl-suite run cosmos_mcts_orpo            # full size (docs/cosmos.md gives the time)
    jaxrl-suite run cosmos_mcts_orpo --smoke    # seconds; what the tests run
    jaxrl-suite run cosmos_mcts_orpo --resume   # a killed run continues where it stopped

The world, its contradiction checker and the hidden quality Q are `envs/text/story.py`; the step
value is `rewards/curiosity.py`. Per seed:
  small  SFT of the small policy pi_0 on the bland storyteller's plots; then rounds r = 0, 1, ...:
           1. collection search (`sampling.mcts`, reward mode) on search.collect_openings
              training openings: every sampled plot scores its return, the mean of unit(step
              value) over its steps, under pi_r (its own surprisal) and the checker;
           2. the value model V_r (`ValueLM`, warm-started from pi_r) regresses, on every node of
              those trees, w * unit(v of the node's last step) + (1 - w) * its backed-up return;
           3. the value-guided search (V_r, search.budget generated tokens per opening) on other
              training openings; at each expanded node the continuation of its highest-V child
              against that of its lowest-V child is an ORPO pair when V differs by
              search.pair_margin;
           4. ORPO (`algorithms.preference`, loss "orpo") from pi_r on those pairs: pi_{r+1}.
         Held-out (eval.num_examples openings): greedy plots of pi_0, pi_1, ...; the value-guided
         search with pi_0 and V_0 at the same budget; the KL of pi_r from pi_0 (on pi_r's
         samples, per token); the share of pi_r's greedy next steps, along the search's best
         plots, that equal the search's step; how V_0 orders pairs of sampled plots against Q.
  large  the same SFT of a model about 4x larger (`large`), greedy.
One SFT run per model (from the first seed) starts every run; the seeds differ in the searches'
samples, the value models and ORPO, so the two greedy SFT rows have no seed spread: their
uncertainty is the standard error of Q over the held-out openings (quality_se).
Writes summary.json, table.md and quality.png.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Annotated

import jax
import numpy as np

from jaxrl_suite.algorithms import lm_study as kit
from jaxrl_suite.algorithms.preference import PreferenceConfig, PreferencePair, PreferenceTrainer
from jaxrl_suite.algorithms.value import ValueConfig, ValueTrainer
from jaxrl_suite.core.config import (
    ConfigError,
    Count,
    NonNegative,
    Probability,
    Range,
    check_fields,
    to_dict,
)
from jaxrl_suite.core.experiment import Experiment, RunOptions
from jaxrl_suite.core.metrics import pyplot, save_figure
from jaxrl_suite.core.parallel import (
    batch_shards,
    gather_rows,
    host_local,
    jit_on_mesh,
    print0,
    process_rows,
    shard_batch,
)
from jaxrl_suite.core.study import format_numbers
from jaxrl_suite.envs.text import Example
from jaxrl_suite.envs.text.story import StoryTask, plot_stats, split_steps
from jaxrl_suite.losses import token_logprobs
from jaxrl_suite.models.sequence import SeqBatch, completion_logits
from jaxrl_suite.models.value import ValueLM, init_from_policy
from jaxrl_suite.rewards.curiosity import (
    CuriosityConfig,
    mixed_target,
    step_surprisal,
    step_value,
    unit,
)
from jaxrl_suite.sampling import mcts
from jaxrl_suite_experiments import CONFIGS

NAME = "cosmos_mcts_orpo"
VARIANTS = ("small", "large")


@dataclasses.dataclass(frozen=True)
class SearchConfig:
    collect_openings: Count = 32  # training openings of the collection search, per round
    collect_iterations: Count = 6  # its MCTS iterations per opening
    openings: Count = 32  # training openings of the value-guided (pair-finding) search, per round
    budget: Count = 1600  # generated tokens per opening of every value-guided search
    iterations: Count = 40  # cap on its iterations (the budget binds first)
    num_samples: Count = 4  # continuations sampled per expansion
    num_decision: Count = 3  # children kept selectable per node
    c: NonNegative = 0.2  # UCT exploration constant
    batch_size: Count = 64  # rows per sampler call
    # value target: w * unit(step value) + (1 - w) * backed-up return
    step_weight: Probability = 0.5
    value: ValueConfig = ValueConfig(steps=100, batch_size=16, lr=1e-3)
    pair_margin: NonNegative = 0.05  # minimum V gap of an ORPO pair

    def __post_init__(self):
        check_fields(self, "search.")  # the Ranges declared above


@dataclasses.dataclass(frozen=True)
class Config:
    task: kit.TaskConfig = kit.TaskConfig(name="story", prompt_len=176)
    model: kit.ModelConfig = kit.ModelConfig()
    large: kit.ModelConfig = kit.ModelConfig()  # the "70B" stand-in, about 4x the parameters
    sft: kit.SFTConfig = kit.SFTConfig()
    # only max_new_tokens (every sampler's length) and the sampling settings are used
    grpo: kit.GRPOConfig = kit.GRPOConfig(max_new_tokens=208)
    curiosity: CuriosityConfig = CuriosityConfig(target=0.12, width=0.05)
    search: SearchConfig = SearchConfig()
    orpo: PreferenceConfig = PreferenceConfig(loss="orpo", lam=0.1, lr=3e-4, batch_size=8,
                                              steps=60)
    rounds: Count = 2  # search -> ORPO rounds
    # sampled plots per held-out opening for the value-vs-Q agreement
    agree_samples: Annotated[int, Range(ge=2)] = 4
    eval: kit.EvalConfig = kit.EvalConfig(num_examples=64, batch_size=64)
    run: kit.RunConfig = kit.RunConfig(seeds=(0, 1, 2), keep_checkpoints=2)

    def __post_init__(self):
        check_fields(self)  # the Ranges declared above (top-level fields)
        if self.task.name != "story":
            raise ConfigError(f"config field 'task.name' must be 'story' for {NAME}, got "
                              f"{self.task.name!r}")
        if self.orpo.loss != "orpo":
            raise ConfigError(f"config field 'orpo.loss' must be 'orpo', got {self.orpo.loss!r}")


class PlotScorer:
    """Token log-probs of plots under a policy, and the COS(M+O)S step values from them."""

    def __init__(self, study: kit.LMStudy, cfg: Config):
        self.study, self.cfg = study, cfg
        self.task: StoryTask = study.lm.task
        self.tok, self.mesh = study.lm.tokenizer, study.lm.mesh
        self.prompt_len, self.max_new = cfg.task.prompt_len, cfg.grpo.max_new_tokens
        n_dev = batch_shards(self.mesh)
        self.batch = max(n_dev, cfg.search.batch_size - cfg.search.batch_size % n_dev)
        model = study.lm.model
        self._logp = jit_on_mesh(lambda p, seq: token_logprobs(completion_logits(model, p, seq),
                                                               seq.completion))

    def _encode(self, texts):
        ids = np.full((len(texts), self.max_new), self.tok.pad_id, np.int32)
        mask = np.zeros((len(texts), self.max_new), np.float32)
        for row, text in enumerate(texts):
            x = self.tok.encode(text)[: self.max_new]
            ids[row, : len(x)] = x
            mask[row, : len(x)] = 1.0
        return ids, mask

    def token_logp(self, params, examples, texts) -> list[np.ndarray]:
        """log pi(t | prompt, earlier tokens) of each text's tokens (at most max_new_tokens),
        in fixed-size batches (one compile)."""
        rows, out = process_rows(self.batch), []
        for start in range(0, len(texts), self.batch):
            ex = list(examples[start : start + self.batch])
            tx = list(texts[start : start + self.batch])
            n = len(tx)
            ex += [ex[-1]] * (self.batch - n)
            tx += [tx[-1]] * (self.batch - n)
            prompt, prompt_mask = self.tok.encode_batch([e.prompt for e in ex], self.prompt_len)
            ids, mask = self._encode(tx)
            seq = shard_batch(SeqBatch(prompt[rows], prompt_mask[rows], ids[rows], mask[rows]),
                              self.mesh)
            logp = gather_rows(host_local(self._logp(params, seq)))[:n]
            out += [lp[: int(m.sum())] for lp, m in zip(logp, mask[:n], strict=True)]
        return out

    def spans(self, lines: list[str]) -> list[tuple[int, int]]:
        """Token positions of each line of a plot "\\n".join(lines), clipped to max_new_tokens
        (exact for a byte tokenizer; prefix-consistent tokenizers as well)."""
        out, text = [], ""
        for j, line in enumerate(lines):
            start = len(self.tok.encode(text + ("\n" if j else ""))) if text or j else 0
            text = text + ("\n" if j else "") + line
            end = len(self.tok.encode(text)) if line else start
            out.append((min(start, self.max_new), min(end, self.max_new)))
        return out

    def plot_values(self, params, examples, plots) -> list[dict]:
        """Per plot: its K lines, their surprisals s_j, contradictions n_j, step values v_j and
        the return mean(unit(v))."""
        k = self.task.num_steps
        lines = [split_steps(p, k) for p in plots]
        texts = ["\n".join(ls) for ls in lines]
        logps = self.token_logp(params, examples, texts)
        out = []
        for ex, ls, lp in zip(examples, lines, logps, strict=True):
            s = step_surprisal(lp, self.spans(ls))
            check = self.task.check("\n".join(ls), ex)
            n = [len(c) for c in check.contradictions]
            v = step_value(s, n, self.cfg.curiosity)
            out.append({"lines": ls, "surprisal": s, "contradictions": n, "values": v,
                        "return": float(np.mean(unit(v)))})
        return out


def run(cfg: Config, opts: RunOptions) -> dict:
    t_start = time.perf_counter()
    study = kit.LMStudy(NAME, cfg, opts, variants=VARIANTS)
    large = study.sibling(cfg.large, ("large",))  # the large runs' model, task and trainers
    task: StoryTask = study.lm.task
    scorer = PlotScorer(study, cfg)
    prompt_len, max_new = cfg.task.prompt_len, cfg.grpo.max_new_tokens
    long_prompt = prompt_len + max_new  # an opening plus some steps
    k = task.num_steps
    held = study.held_out
    s = cfg.search
    greedy = study.lm_trainer()
    stepper = study.lm_trainer(prompt_len=long_prompt)

    def finished(state: str) -> bool:  # the opening has one "\n"; each step adds one
        return state.count("\n") > k

    def expand_fn(params, seed, salt):
        return study.expand_fn(params, prompt_len=long_prompt, batch_size=s.batch_size,
                               rng=jax.random.fold_in(study.grpo_key(seed), salt),
                               finished=finished)

    def opening_of(program: str, by_prompt: dict) -> Example:
        return by_prompt[program[: program.index("\n") + 1]]

    def returns_fn(params, openings, step_unit: dict | None = None):
        """reward_fn for a search in reward mode: each sampled program's return under `params`
        (its own surprisal, the checker's contradictions); with `step_unit`, also records
        unit(v) of every step, keyed by the state it ends (with and without its newline)."""
        by_prompt = {e.prompt: e for e in openings}

        def reward_fn(programs):
            exs = [opening_of(p, by_prompt) for p in programs]
            scored = scorer.plot_values(params, exs, [p[len(e.prompt):]
                                                      for p, e in zip(programs, exs, strict=True)])
            for e, sc in zip(exs, scored, strict=True):
                for j in range(k if step_unit is not None else 0):
                    if not sc["lines"][j]:  # missing: no state of its own
                        break
                    prefix = e.prompt + "\n".join(sc["lines"][: j + 1])
                    u = float(unit(sc["values"][j]))
                    step_unit[prefix] = step_unit[prefix + "\n"] = u
            return np.array([sc["return"] for sc in scored])

        return reward_fn

    def collect(params, seed: int, r: int) -> dict:
        """Collection search with exact returns: value targets on every node."""
        openings = task.examples("train", 2 * r * s.collect_openings, s.collect_openings)
        step_unit: dict[str, float] = {}
        config = mcts.MCTSConfig(iterations=s.collect_iterations, c=s.c, eps=0.1,
                                 num_samples=s.num_samples, num_decision=s.num_decision)
        found = mcts.search_batch([e.prompt for e in openings], expand_fn(params, seed, 100 + r),
                                  config, reward_fn=returns_fn(params, openings, step_unit))
        targets = [(st, mixed_target(step_unit.get(st), v, s.step_weight))
                   for f in found for st, v in f.targets]
        return {"states": [t[0] for t in targets], "targets": [t[1] for t in targets],
                "tokens": float(np.mean([f.tokens for f in found]))}

    def exact_search(params, seed: int) -> dict:
        """The held-out search at the same budget, backing up exact step values instead of the
        value model's (what a perfect V_0 would give the search)."""
        config = mcts.MCTSConfig(iterations=s.iterations, c=s.c, eps=0.1,
                                 num_samples=s.num_samples, num_decision=s.num_decision,
                                 token_budget=s.budget)
        found = mcts.search_batch([e.prompt for e in held], expand_fn(params, seed, 400), config,
                                  reward_fn=returns_fn(params, held))
        plots = [f.program[len(e.prompt):] for f, e in zip(found, held, strict=True)]
        return {**quality(plots, held), "tokens": float(np.mean([f.tokens for f in found]))}

    def value_model(params, data: dict, seed: int):
        vm = ValueLM(study.lm.model.config)
        trainer = ValueTrainer(vm, study.lm.tokenizer, s.value, mesh=study.lm.mesh,
                               state_len=long_prompt)
        init = init_from_policy(vm.init(jax.random.PRNGKey(seed), *trainer.encode(["x"])),
                                params)
        state, hist = trainer.fit(trainer.init_state(init, jax.random.PRNGKey(seed + 1)),
                                  data["states"], np.array(data["targets"]), seed=seed)
        return trainer.value_fn(state.params), float(hist["mse"][-10:].mean())

    def guided(params, value_fn, examples, seed: int, salt: int):
        config = mcts.MCTSConfig(iterations=s.iterations, c=s.c, eps=0.1,
                                 num_samples=s.num_samples, num_decision=s.num_decision,
                                 token_budget=s.budget)
        return mcts.search_batch([e.prompt for e in examples], expand_fn(params, seed, salt),
                                 config, value_fn=value_fn)

    def pairs_of(found) -> list[list[str]]:
        """(state, chosen, rejected): at each expanded node, a sample of its highest-V child
        against one of its lowest-V child."""
        out = []
        for f in found:
            for node in mcts.walk(f.root):
                kids = [c for c in node.children.values() if c.programs]
                if len(kids) < 2:
                    continue
                hi, lo = max(kids, key=lambda c: c.value), min(kids, key=lambda c: c.value)
                chosen, rejected = hi.programs[0][len(node.state):], lo.programs[0][
                    len(node.state):]
                if hi.value - lo.value >= s.pair_margin and chosen.strip() and rejected.strip():
                    out.append([node.state, chosen, rejected])
        return out

    def quality(plots, examples) -> dict:
        """Means over the openings, and the standard error of Q over them."""
        checks = [task.check(p, e) for p, e in zip(plots, examples, strict=True)]
        q = np.array([c.quality for c in checks])
        return {**plot_stats(checks), "quality_se": float(q.std() / np.sqrt(max(1, len(q))))}

    def greedy_eval(trainer, params) -> dict:
        plots, _ = trainer.greedy_completions(params, held, batch_size=cfg.eval.batch_size)
        return {**quality(plots, held), "plots": plots}

    def kl_from(params, ref_params, seed: int) -> float:
        texts, _ = greedy.sampled_completions(params, held, batch_size=cfg.eval.batch_size,
                                              rng=jax.random.PRNGKey(seed + 31))
        new = scorer.token_logp(params, held, texts)
        old = scorer.token_logp(ref_params, held, texts)
        diff = np.concatenate([a - b for a, b in zip(new, old, strict=True)])
        return float(diff.mean()) if diff.size else 0.0

    def step_match(params, reference: list[str]) -> float:
        """Share of greedy next steps along the reference plots that equal their next step."""
        states, wanted = [], []
        for ex, plot in zip(held, reference, strict=True):
            lines = split_steps(plot, k)
            for j in range(k):
                if lines[j]:
                    states.append(Example(ex.prompt + "".join(x + "\n" for x in lines[:j]), ""))
                    wanted.append(lines[j])
        texts, _ = stepper.greedy_completions(params, states, batch_size=cfg.eval.batch_size)
        got = [t.split("\n")[0] for t in texts]
        return float(np.mean([a == b for a, b in zip(got, wanted, strict=True)])) if got else 0.0

    def agreement(params, value_fn, seed: int) -> dict:
        """How V_0 (and the exact return) order sampled plots of an opening against Q."""
        n = cfg.agree_samples
        flat = [e for e in held for _ in range(n)]
        texts, _ = greedy.sampled_completions(params, flat, batch_size=cfg.eval.batch_size,
                                              rng=jax.random.PRNGKey(seed + 41))
        plots = ["\n".join(split_steps(t, k)) for t in texts]
        q = np.array([task.check(p, e).quality for p, e in zip(plots, flat, strict=True)])
        v = np.asarray(value_fn([e.prompt + p for p, e in zip(plots, flat, strict=True)]))
        ret = np.array([x["return"] for x in scorer.plot_values(params, flat, plots)])
        out = {}
        for name, x in (("value", v), ("return", ret)):
            agree = total = 0.0
            for i in range(len(held)):
                qi, xi = q[i * n:(i + 1) * n], x[i * n:(i + 1) * n]
                for a in range(n):
                    for b in range(a + 1, n):
                        if qi[a] == qi[b]:
                            continue
                        total += 1
                        d = (xi[a] - xi[b]) * (qi[a] - qi[b])
                        agree += 1.0 if d > 0 else (0.5 if xi[a] == xi[b] else 0.0)
            out[f"{name}_pair_agreement"] = agree / total if total else float("nan")
            ok = np.std(x) > 0 and np.std(q) > 0
            out[f"{name}_corr"] = float(np.corrcoef(x, q)[0, 1]) if ok else float("nan")
        out["pairs"] = total
        return out

    def surprisal_stats(params, plots) -> dict:
        scored = scorer.plot_values(params, held, plots)
        s_all = np.concatenate([x["surprisal"] for x in scored])
        s_all = s_all[np.isfinite(s_all)]
        return {"surprisal_mean": float(s_all.mean()) if s_all.size else float("nan"),
                "surprisal_q10": float(np.quantile(s_all, 0.1)) if s_all.size else float("nan"),
                "surprisal_q90": float(np.quantile(s_all, 0.9)) if s_all.size else float("nan")}

    def train_small(seed: int, sft_params) -> dict:
        ckpt, run_dir = study.checkpoint_dir("small", seed), study.run_dir("small", seed)
        stages = [(ckpt / f"orpo{r + 1}", r * cfg.orpo.steps) for r in range(cfg.rounds)]
        out: dict = {}
        with study.log(run_dir, stages) as log:
            policies = [sft_params]
            evals = {0: study.cached(opts.out_dir / "greedy_sft.json",
                                     lambda: greedy_eval(greedy, sft_params))}
            for r in range(cfg.rounds + 1):
                params = policies[r]
                if r:
                    evals[r] = study.cached(run_dir / f"greedy{r}.json",
                                            lambda p=params: greedy_eval(greedy, p))
                if r == cfg.rounds:
                    break
                data = study.cached(run_dir / f"collect{r}.json",
                                    lambda p=params, r=r: collect(p, seed, r))

                def search_round(p=params, data=data, r=r) -> dict:
                    value_fn, mse = value_model(p, data, seed * 10 + r)
                    openings = task.examples("train", (2 * r + 1) * s.collect_openings,
                                             s.openings)
                    found = guided(p, value_fn, openings, seed, 200 + r)
                    res = {"pairs": pairs_of(found), "value_mse": mse,
                           "tokens": float(np.mean([f.tokens for f in found]))}
                    if r == 0:  # held-out: the small policy with MCTS, and V_0 against Q
                        test = guided(p, value_fn, held, seed, 300)
                        plots = [f.program[len(e.prompt):] for f, e in zip(test, held,
                                                                           strict=True)]
                        res["mcts"] = {**quality(plots, held), "plots": plots,
                                       "tokens": float(np.mean([f.tokens for f in test]))}
                        res["agreement"] = agreement(p, value_fn, seed)
                    return res

                found = study.cached(run_dir / f"search{r}.json", search_round)
                if r == 0:
                    out["mcts"], out["agreement"] = found["mcts"], found["agreement"]
                out[f"pairs_{r}"] = len(found["pairs"])
                out[f"value_mse_{r}"] = found["value_mse"]
                out[f"targets_{r}"] = len(data["targets"])
                pairs = [PreferencePair(Example(st, ""), ch, rj) for st, ch, rj in found["pairs"]]
                if not pairs:  # nothing to prefer: the policy carries over
                    policies.append(params)
                    continue
                trainer = PreferenceTrainer(
                    study.lm.model, study.lm.tokenizer, task, cfg.orpo, mesh=study.lm.mesh,
                    prompt_len=long_prompt, max_new_tokens=max_new, pairs=pairs,
                    greedy_sampler=greedy.greedy_sampler, eval_sampler=greedy.eval_sampler)
                init = trainer.init_state(params, jax.random.fold_in(study.grpo_key(seed), r))
                state = study.fit(trainer, init, stage=f"orpo{r + 1}", num_steps=cfg.orpo.steps,
                                  checkpoint_dir=ckpt / f"orpo{r + 1}", logger=log,
                                  step_offset=r * cfg.orpo.steps,
                                  postfix=("loss",))
                policies.append(state.params)
        reference = out["mcts"]["plots"]  # the search's best plots with pi_0 and V_0
        for r, params in enumerate(policies):
            out[f"greedy_{r}"] = evals[r]
            extra = study.cached(run_dir / f"shift{r}.json", lambda p=params, r=r: {
                "kl": kl_from(p, policies[0], seed) if r else 0.0,
                "match": step_match(p, reference),
                **surprisal_stats(p, evals[r]["plots"])})
            out[f"kl_{r}"], out[f"match_{r}"] = extra["kl"], extra["match"]
            out[f"surprisal_{r}"] = {x: extra[x] for x in extra if x.startswith("surprisal")}
        return out

    def large_sft():
        """The large model's SFT, once (from the first seed), like the small one's."""
        ckpt, run_dir = large.checkpoint_dir("large") / "sft", large.run_dir("large")
        with large.log(run_dir, [(ckpt, 0)]) as log:
            sft = large.sft(large.start_seed, checkpoint_dir=ckpt, logger=log)
        return {"greedy": study.cached(run_dir / "greedy.json",
                                       lambda: greedy_eval(large.lm_trainer(), sft.params))}

    shared: dict = {}

    def train(variant: str, seed: int, sft_params) -> dict:
        t0 = time.perf_counter()
        if variant == "small":
            out = train_small(seed, sft_params)
        else:  # one SFT run; every seed reports its greedy plots (seed std 0)
            if "large" not in shared:
                shared["large"] = large_sft()
            out = shared["large"]
        return {**_flat(out, cfg.rounds), "detail": _strip_plots(out),
                "wall_time_s": time.perf_counter() - t0}

    sft_params = study.shared_sft().params  # checkpoints/sft: every small run starts here
    results = study.run(train, sft_params, fmt=lambda r: format_numbers(
        {x: r[x] for x in r if x.endswith("quality") or x.startswith(("kl_", "match_"))}))
    for seed in study.seeds:  # the search with exact step values, after the runs (resumable)
        found = study.cached(study.run_dir("small", seed) / "mcts_exact.json",
                             lambda seed=seed: exact_search(sft_params, seed))
        results[study.run_name("small", seed)].update(
            {f"mcts_exact_{m}": x for m, x in found.items()})
    rows = _rows(cfg.rounds)
    stats = {}
    for label, (variant, key) in rows.items():
        runs = [results[study.run_name(variant, sd)] for sd in study.seeds]
        stats[label] = {m: _mean_std([x[f"{key}{m}"] for x in runs if f"{key}{m}" in x])
                        for m in _METRICS}
    small = [results[study.run_name("small", sd)] for sd in study.seeds]
    shift = {f"round_{r}": {"kl": _mean_std([x[f"kl_{r}"] for x in small]),
                            "match": _mean_std([x[f"match_{r}"] for x in small])}
             for r in range(cfg.rounds + 1)}
    agree = {m: _mean_std([x[f"agreement_{m}"] for x in small])
             for m in ("value_pair_agreement", "value_corr", "return_pair_agreement",
                       "return_corr")}
    claims = None
    if jax.process_index() == 0:
        claims = _claims(stats, cfg.rounds)
        _plot(stats, opts.out_dir / "quality.png")
    for name, row in (claims or {}).items():
        print0(f"[{NAME}] {name}: {format_numbers(row)}")
    return study.finish({
        "experiment": NAME, "rows": stats, "shift": shift, "agreement": agree,
        "claims": claims, "wall_time_s": time.perf_counter() - t_start,
        "resumed": opts.resume, "config": to_dict(cfg)}, _table(stats, shift, agree))


_METRICS = ("quality", "quality_se", "contradiction_rate", "coherence", "progress", "variety",
            "predictability")


def _rows(rounds: int) -> dict[str, tuple[str, str]]:
    """Table row -> (variant, prefix of its flat result keys)."""
    rows = {"small, greedy (SFT)": ("small", "greedy_0_"), "small + MCTS": ("small", "mcts_"),
            "small + MCTS, exact step values": ("small", "mcts_exact_")}
    for r in range(1, rounds + 1):
        rows[f"small + {r} ORPO round{'s' if r > 1 else ''}, greedy"] = ("small", f"greedy_{r}_")
    rows["large (about 4x), greedy"] = ("large", "greedy_")
    return rows


def _flat(out: dict, rounds: int) -> dict:
    """The numbers of a run as flat keys (greedy_0_quality, mcts_quality, kl_1, ...)."""
    flat = {}
    for key, val in out.items():
        if isinstance(val, dict):
            for m, x in val.items():
                if isinstance(x, (int, float)):
                    flat[f"{key}_{m}"] = float(x)
        elif isinstance(val, (int, float)):
            flat[key] = float(val)
    return flat


def _strip_plots(out: dict) -> dict:
    """The run's detail without the plot texts, plus a few plots to read."""
    detail = {}
    for key, val in out.items():
        if isinstance(val, dict) and "plots" in val:
            val = {**{m: x for m, x in val.items() if m != "plots"},
                   "examples": val["plots"][:3]}
        detail[key] = val
    return detail


def _mean_std(xs) -> dict:
    xs = [float(x) for x in xs if x is not None and np.isfinite(x)]
    if not xs:
        return {"mean": float("nan"), "std": float("nan"), "per_seed": []}
    return {"mean": float(np.mean(xs)), "std": float(np.std(xs)), "per_seed": xs}


def _claims(stats: dict, rounds: int) -> dict:
    """Gaps in hidden quality to the large model's single pass (what the claim is judged by)."""
    big = stats["large (about 4x), greedy"]["quality"]["mean"]
    base = stats["small, greedy (SFT)"]["quality"]["mean"]
    out = {}
    for label, row in stats.items():
        if label.startswith("large"):
            continue
        q = row["quality"]["mean"]
        out[label] = {"quality": q, "minus_large": q - big, "minus_small_greedy": q - base}
    return out


def _table(stats: dict, shift: dict, agree: dict) -> str:
    head = "| policy | " + " | ".join(_METRICS) + " |\n|---|" + "---|" * len(_METRICS) + "\n"
    for label, row in stats.items():
        cells = [f"{row[m]['mean']:.3f} ± {row[m]['std']:.3f}" for m in _METRICS]
        head += f"| {label} | " + " | ".join(cells) + " |\n"
    head += "\n| round | KL(pi_r, pi_0) per token | greedy steps = search's step |\n|---|---|---|\n"
    for r, row in shift.items():
        head += (f"| {r} | {row['kl']['mean']:.4f} ± {row['kl']['std']:.4f} | "
                 f"{row['match']['mean']:.3f} ± {row['match']['std']:.3f} |\n")
    head += "\n| scorer | pairs ordered like Q | Pearson r with Q |\n|---|---|---|\n"
    for name in ("value", "return"):
        a, c = agree[f"{name}_pair_agreement"], agree[f"{name}_corr"]
        head += (f"| {name} | {a['mean']:.3f} ± {a['std']:.3f} | "
                 f"{c['mean']:.3f} ± {c['std']:.3f} |\n")
    return head


def _plot(stats: dict, path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.8))
    labels = list(stats)
    means = [stats[x]["quality"]["mean"] for x in labels]
    stds = [stats[x]["quality"]["std"] for x in labels]
    ax.barh(range(len(labels)), means, xerr=stds, color="tab:blue", alpha=0.8)
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("hidden quality Q (mean ± std over seeds)")
    ax.set_title("COS(M+O)S on the story world")
    save_figure(fig, path)


EXPERIMENT = Experiment(
    name=NAME, config_cls=Config, run=run, config=CONFIGS / f"{NAME}.yaml",
    description="COS(M+O)S: curiosity/coherence value, MCTS over plot steps, iterated ORPO",
)

if __name__ == "__main__":
    from jaxrl_suite.cli import main

    sys.exit(main(["run", NAME, *sys.argv[1:]]))
