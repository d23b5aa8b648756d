"""ReST-GRPO's data filter (Zhoubian, Zhang and Tang 2025, "ReST-RL: Achieving Accurate Code
Reasoning of LLMs with Optimized Self-Training and Decoding", arXiv 2508.19576; code THUDM/ReST-RL,
`experiment/process_gen_data.py`).

GRPO learns nothing from a prompt whose G sampled completions all get the same reward: the
group-normalised advantages are all zero. ReST-GRPO therefore builds each round's training set
from the policy's own samples (n = 5 per problem):

1. keep a problem iff the population std of its n rewards is >= min_std (0.05);
2. for a kept problem whose best completion scores >= best_threshold (0.9), cut that completion
   at line ends into cumulative prefixes (prompt + first j lines) and add ceil(frac * L) of
   them (frac = 0.5), drawn with replacement with P(j) proportional to decay**j (decay = 0.95),
   as new prompts: partial solutions that start the model part-way, where its rewards vary.

The paper's claim is that this raises the reward variance of the training prompts, which
`filter_stats` measures. Everything here is host-side Python/numpy (strings do not jit), and
deterministic given a `numpy.random.Generator`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def _rewards_1d(rewards: Sequence[float] | np.ndarray) -> np.ndarray:
    r = np.asarray(rewards, np.float64)
    if r.ndim != 1 or r.size == 0:
        raise ValueError(f"rewards must be a non-empty 1-D sequence, got shape {r.shape}")
    if not np.all(np.isfinite(r)):
        raise ValueError(f"rewards must be finite, got {r}")
    return r


def keep_problem(rewards: Sequence[float] | np.ndarray, min_std: float = 0.05) -> bool:
    """Whether a problem's sampled rewards vary enough to train GRPO on.

        keep  iff  std(r_1..r_n) >= min_std          (population std, ddof = 0)

    As the authors (`np.std(rewards) < threshold` drops it): a std exactly at the threshold
    is kept; a single sample (std 0) is dropped unless min_std is 0.

    Args:
      rewards: [n] the rewards of the problem's n sampled completions.
      min_std: the threshold, >= 0.

    Returns:
      True to keep the problem.
    """
    if not min_std >= 0:
        raise ValueError(f"min_std must be >= 0, got {min_std}")
    return bool(np.std(_rewards_1d(rewards)) >= min_std)


def line_prefixes(completion: str, *, include_full: bool = True) -> list[str]:
    """The cumulative line prefixes of a completion, each ending with "\\n".

        completion.rstrip() = l_1 \\n l_2 \\n ... \\n l_L
        prefixes            = [l_1 \\n,  l_1 \\n l_2 \\n,  ...,  l_1 \\n ... l_L \\n]

    Trailing whitespace is stripped first (as the authors do), so empty or whitespace-only
    trailing lines are not lines; interior empty lines are (the text is split on "\\n" only).
    Each prefix ends with "\\n" so that the model continues on a new line.

    Prefix range: j = 1..L, the authors' choice (their loop appends every line, the last one
    included). The full-completion prefix leaves the model only the closing of its answer, so
    its group's rewards rarely vary; `include_full=False` gives j = 1..L-1 instead (then a
    single-line completion has no prefix).

    Args:
      completion: the completion text (without the prompt).
      include_full: whether the prefix holding all L lines is included.

    Returns:
      The prefixes; entry i holds the first i + 1 lines. Empty for an empty completion.
    """
    text = completion.rstrip()
    if not text:
        return []
    lines = text.split("\n")
    n = len(lines) if include_full else len(lines) - 1
    prefixes, prefix = [], ""
    for line in lines[:n]:
        prefix += line + "\n"
        prefixes.append(prefix)
    return prefixes


def sample_prefixes(
    prefixes: Sequence[str], rng: np.random.Generator, *, frac: float = 0.5, decay: float = 0.95
) -> list[int]:
    """Draws which prefixes become prompts, favouring short ones.

        k    = ceil(frac * L)                        (L = len(prefixes); 0 when L = 0)
        P(i) = decay**(i + 1) / sum_j decay**j       (entry i has j = i + 1 lines)
        k draws with replacement

    The authors' `sample_with_exponential_distribution` (weights alpha**i, `random.choices`),
    with a numpy Generator. `frac * L` is rounded to 9 decimals before the ceiling, so that
    float error (0.1 * 30 = 3.0000000000000004) does not add a draw.

    Args:
      prefixes: the candidate prefixes (`line_prefixes`); only their number matters.
      rng: the numpy Generator to draw with.
      frac: the fraction of L to draw, in (0, 1].
      decay: the per-line decay, in (0, 1] (1 gives uniform draws).

    Returns:
      k positions into `prefixes` (0-based: position i is the prefix of i + 1 lines).
    """
    if not 0 < frac <= 1:
        raise ValueError(f"frac must be in (0, 1], got {frac}")
    if not 0 < decay <= 1:
        raise ValueError(f"decay must be in (0, 1], got {decay}")
    n = len(prefixes)
    if n == 0:
        return []
    k = math.ceil(round(frac * n, 9))
    p = float(decay) ** np.arange(n)  # [L], proportional to decay**j, j = 1..L
    return rng.choice(n, size=k, replace=True, p=p / p.sum()).tolist()


def _check_problems(prompts, completions, rewards) -> None:
    if not len(prompts) == len(completions) == len(rewards):
        raise ValueError(f"prompts, completions and rewards must have one entry per problem, got "
                         f"{len(prompts)}, {len(completions)} and {len(rewards)}")
    for i, (c, r) in enumerate(zip(completions, rewards, strict=True)):
        if len(c) != len(r):
            raise ValueError(f"problem {i}: {len(c)} completions but {len(r)} rewards")


def rest_grpo_prompts(
    prompts: Sequence[str],
    completions: Sequence[Sequence[str]],
    rewards: Sequence[Sequence[float]],
    rng: np.random.Generator,
    *,
    min_std: float = 0.05,
    best_threshold: float = 0.9,
    frac: float = 0.5,
    decay: float = 0.95,
    include_full: bool = True,
) -> tuple[list[int], list[tuple[int, str]]]:
    """ReST-GRPO's training prompts from one round of samples (n completions per problem).

    For each problem i, in order:
      1. drop it unless `keep_problem(rewards[i], min_std)`;
      2. if its best completion (highest reward, the first on ties) scores >= best_threshold,
         add (i, prompts[i] + prefixes[j]) for each j of
         `sample_prefixes(line_prefixes(best), rng, frac=frac, decay=decay)`.

    A problem dropped by the std filter contributes no partial prompt either, as in the
    authors' pipeline (`process_gen_data.py` skips the problem entirely when its std is below
    the threshold, before looking at its best completion). The dropped problems whose best
    completion would qualify are the all-solved ones (every reward equal and >= 0.9): too easy
    to learn from, and their prefixes would mostly give all-solved groups again. A kept problem
    with no completion >= best_threshold adds only itself.

    The generator is used once per problem that gets prefixes, in problem order, so the result
    is a deterministic function of the inputs and the generator's state.

    Args:
      prompts: [P] the problems' prompts.
      completions: [P][n] the sampled completions (text after the prompt).
      rewards: [P][n] their rewards.
      rng: the numpy Generator for `sample_prefixes`.
      min_std, best_threshold, frac, decay, include_full: see `keep_problem`,
        `line_prefixes` and `sample_prefixes`; best_threshold = 0.9 as the authors.

    Returns:
      (kept_problem_indices, partial_prompts): the indices of the kept problems (ascending),
      whose original prompts are trained on, and the (problem index, prompt + prefix) pairs
      to add (a prefix may appear more than once: draws are with replacement).
    """
    _check_problems(prompts, completions, rewards)
    kept: list[int] = []
    partial: list[tuple[int, str]] = []
    for i, (prompt, comps, rs) in enumerate(zip(prompts, completions, rewards, strict=True)):
        if not keep_problem(rs, min_std):
            continue
        kept.append(i)
        best = int(np.argmax(np.asarray(rs, np.float64)))  # the first maximum
        if rs[best] < best_threshold:
            continue
        prefixes = line_prefixes(comps[best], include_full=include_full)
        for j in sample_prefixes(prefixes, rng, frac=frac, decay=decay):
            partial.append((i, prompt + prefixes[j]))
    return kept, partial


def dpo_pairs(completions: Sequence[Sequence[str]], rewards: Sequence[Sequence[float]], *,
              min_std: float = 0.05) -> list[tuple[int, str, str]]:
    """ReST-DPO's preference data from one round of samples: for each problem i that
    `keep_problem(rewards[i], min_std)` keeps, in order, (i, its best completion, its worst
    completion) by reward (the first maximum and the first minimum on ties)."""
    _check_problems(completions, completions, rewards)
    return [(i, comps[int(np.argmax(rs))], comps[int(np.argmin(rs))])
            for i, (comps, rs) in enumerate(zip(completions, rewards, strict=True))
            if keep_problem(rs, min_std)]


def filter_stats(
    rewards: Sequence[Sequence[float]], *, min_std: float = 0.05
) -> dict[str, float]:
    """How the std filter changes the problems' reward variance (the paper's mechanism).

        var_i         = population variance (ddof = 0) of problem i's rewards
        kept_fraction = |K| / P,            K = {i : keep_problem(rewards[i], min_std)}
        var_before    = mean_i var_i        over all P problems
        var_after     = mean_{i in K} var_i (NaN when nothing is kept)

    Args:
      rewards: [P][n] rewards of each problem's sampled completions (n may vary).
      min_std: the filter's threshold (`keep_problem`).

    Returns:
      {"kept_fraction", "reward_var_before", "reward_var_after", "n_problems", "n_kept"}.
    """
    if len(rewards) == 0:
        raise ValueError("rewards must hold at least one problem")
    variances = np.array([np.var(_rewards_1d(r)) for r in rewards])  # [P]
    keep = np.array([keep_problem(r, min_std) for r in rewards])  # [P]
    return {
        "kept_fraction": float(keep.mean()),
        "reward_var_before": float(variances.mean()),
        "reward_var_after": float(variances[keep].mean()) if keep.any() else float("nan"),
        "n_problems": float(len(keep)),
        "n_kept": float(keep.sum()),
    }


__all__ = ["dpo_pairs", "filter_stats", "keep_problem", "line_prefixes", "rest_grpo_prompts",
           "sample_prefixes"]
