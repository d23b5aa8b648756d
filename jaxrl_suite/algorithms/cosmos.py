"""COS(M+O)S's plumbing (Materzok 2025, arXiv 2501.17104): its search settings, and the plot
scorer that turns a policy's token log-probs and the story world's checker into step values.

A plot is K lines, one per step, after an opening (`envs.text.story`). `PlotScorer` scores plots
under a policy: the token log-probs of the plot "\\n".join(lines) (no EOS; at most
max_new_tokens tokens) through `sampling.LMRunner.score`, each line's span of tokens
(`rewards.curiosity.step_spans`), the checker's contradictions per step, and from them the step
values v_j and the plot's return mean_j unit(v_j) (`rewards.curiosity.plot_score`). Its
`reward_fn` is what a reward-mode `sampling.mcts` search backs up. The experiment is
experiments/cosmos_mcts_orpo.py (docs/cosmos.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from jaxrl_suite.algorithms.value import ValueConfig
from jaxrl_suite.core.config import Count, NonNegative, Probability, check_fields
from jaxrl_suite.envs.text import Example
from jaxrl_suite.envs.text.story import StoryTask, plot_stats, split_steps
from jaxrl_suite.rewards.curiosity import CuriosityConfig, plot_score, step_spans, unit
from jaxrl_suite.sampling import mcts
from jaxrl_suite.sampling.evaluate import ranking_agreement
from jaxrl_suite.sampling.runner import LMRunner


@dataclasses.dataclass(frozen=True)
class PlotSearchConfig:
    """The collection search, the value model and the value-guided (pair-finding) search."""

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

    def mcts(self, *, collect: bool = False) -> mcts.MCTSConfig:
        """The collection search's `MCTSConfig` (collect_iterations, no budget), or the
        value-guided one's (iterations, token budget); eps 0.1."""
        if collect:
            return mcts.MCTSConfig(iterations=self.collect_iterations, c=self.c, eps=0.1,
                                   num_samples=self.num_samples, num_decision=self.num_decision)
        return mcts.MCTSConfig(iterations=self.iterations, c=self.c, eps=0.1,
                               num_samples=self.num_samples, num_decision=self.num_decision,
                               token_budget=self.budget)


class PlotScorer:
    """Step values of plots under a policy (module docstring), `batch_size` rows at a time.

    `runner` is an `LMRunner` on the story task (its prompt_len fits an opening, its
    max_new_tokens a plot)."""

    def __init__(self, runner: LMRunner, curiosity: CuriosityConfig, *, batch_size: int):
        self.runner, self.curiosity, self.batch_size = runner, curiosity, batch_size
        self.task: StoryTask = runner.task

    def token_logp(self, params, examples: Sequence[Example],
                   texts: Sequence[str]) -> list[np.ndarray]:
        """log pi(t | prompt, earlier tokens) of each text's tokens (no EOS; at most
        max_new_tokens of them)."""
        logp, mask = self.runner.score(params, examples, texts, batch_size=self.batch_size,
                                       eos=False)
        return [lp[: int(m.sum())] for lp, m in zip(logp, mask, strict=True)]

    def plot_values(self, params, examples: Sequence[Example],
                    plots: Sequence[str]) -> list[dict]:
        """Per plot: its K lines and `rewards.curiosity.plot_score` of them (surprisals s_j,
        contradictions n_j, step values v_j, the return mean(unit(v)))."""
        k, tok = self.task.num_steps, self.runner.tokenizer
        lines = [split_steps(p, k) for p in plots]
        texts = ["\n".join(ls) for ls in lines]
        out = []
        for ex, ls, text, lp in zip(examples, lines, texts,
                                    self.token_logp(params, examples, texts), strict=True):
            n = [len(c) for c in self.task.check(text, ex).contradictions]
            spans = step_spans(tok.encode, ls, self.runner.max_new_tokens)
            out.append({"lines": ls, **plot_score(lp, spans, n, self.curiosity)})
        return out

    def reward_fn(self, params, openings: Sequence[Example],
                  step_unit: dict | None = None) -> Callable[[list[str]], np.ndarray]:
        """reward_fn of a reward-mode `mcts` search from `openings`: each sampled program's
        return under `params`; with `step_unit`, also records unit(v) of every step, keyed by
        the state it ends (with and without its newline)."""
        by_prompt = {e.prompt: e for e in openings}

        def reward_fn(programs):
            exs = [by_prompt[p[: p.index("\n") + 1]] for p in programs]  # the opening's line
            scored = self.plot_values(params, exs, [p[len(e.prompt):]
                                                    for p, e in zip(programs, exs, strict=True)])
            for e, sc in zip(exs, scored, strict=True):
                for j in range(self.task.num_steps if step_unit is not None else 0):
                    if not sc["lines"][j]:  # missing: no state of its own
                        break
                    prefix = e.prompt + "\n".join(sc["lines"][: j + 1])
                    step_unit[prefix] = step_unit[prefix + "\n"] = float(unit(sc["values"][j]))
            return np.array([sc["return"] for sc in scored])

        return reward_fn

    def quality(self, plots: Sequence[str], examples: Sequence[Example]) -> dict:
        """`envs.text.story.plot_stats` of the plots (means over the openings: Q, its parts,
        the contradiction rate), and quality_se, the standard error of Q over them."""
        checks = [self.task.check(p, e) for p, e in zip(plots, examples, strict=True)]
        q = np.array([c.quality for c in checks])
        return {**plot_stats(checks), "quality_se": float(q.std() / np.sqrt(max(1, len(q))))}

    def step_match(self, runner: LMRunner, params, examples: Sequence[Example],
                   reference: Sequence[str], *, batch_size: int) -> float:
        """Share of `runner`'s greedy next steps (prompts: each opening plus the first j steps of
        its reference plot) equal to the reference's step j + 1, over the present steps."""
        states, wanted = [], []
        for ex, plot in zip(examples, reference, strict=True):
            lines = split_steps(plot, self.task.num_steps)
            for j, line in enumerate(lines):
                if line:
                    states.append(Example(ex.prompt + "".join(x + "\n" for x in lines[:j]), ""))
                    wanted.append(line)
        texts, _ = runner.complete(params, states, batch_size=batch_size) if states else ([], [])
        got = [t.split("\n")[0] for t in texts]
        return float(np.mean([a == b for a, b in zip(got, wanted, strict=True)])) if got else 0.0

    def agreement(self, params, value_fn: Callable, examples: Sequence[Example],
                  texts: Sequence[str], group_size: int) -> dict:
        """How `value_fn` (of opening + plot) and the exact return under `params` order the
        plots (each text's K steps; `group_size` consecutive ones per opening) against Q:
        `sampling.evaluate.ranking_agreement` of each, as {value,return}_pair_agreement,
        {value,return}_corr and pairs."""
        k = self.task.num_steps
        plots = ["\n".join(split_steps(t, k)) for t in texts]
        q = [self.task.check(p, e).quality for p, e in zip(plots, examples, strict=True)]
        scores = {"value": value_fn([e.prompt + p for p, e in zip(plots, examples, strict=True)]),
                  "return": [x["return"] for x in self.plot_values(params, examples, plots)]}
        out = {}
        for name, x in scores.items():
            a = ranking_agreement(x, q, group_size)
            out.update({f"{name}_pair_agreement": a["pair_agreement"], f"{name}_corr": a["corr"],
                        "pairs": a["pairs"]})
        return out

    def kl(self, params, ref_params, examples: Sequence[Example], texts: Sequence[str]) -> float:
        """Mean over all tokens of `texts` of log pi(t) - log pi_ref(t): KL(pi, pi_ref) per
        token when the texts are pi's samples (0.0 with no tokens)."""
        new = self.token_logp(params, examples, texts)
        old = self.token_logp(ref_params, examples, texts)
        diff = np.concatenate([a - b for a, b in zip(new, old, strict=True)])
        return float(diff.mean()) if diff.size else 0.0

    def surprisal_stats(self, params, examples: Sequence[Example], plots: Sequence[str]) -> dict:
        """Mean, 10% and 90% quantiles of the plots' finite step surprisals (nan: none)."""
        s = np.concatenate([x["surprisal"] for x in self.plot_values(params, examples, plots)])
        s = s[np.isfinite(s)]
        stats = {"mean": np.mean, "q10": lambda x: np.quantile(x, 0.1),
                 "q90": lambda x: np.quantile(x, 0.9)}
        return {f"surprisal_{k}": float(f(s)) if s.size else float("nan")
                for k, f in stats.items()}


__all__ = ["PlotScorer", "PlotSearchConfig"]
