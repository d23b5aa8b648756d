"""Value-model-guided Monte Carlo tree search over lines of code (VM-MCTS of ReST-RL, Zhoubian et
al. 2025, arXiv 2508.19576), with its baselines at an equal token budget, on the host, in numpy.

This is a host-side tree. The language model, the value model and the verifier are plain
callables passed in, and each takes a list, so one call serves every node being expanded:

  expand_fn(states, n) -> [[Sample] * n] * len(states)   n sampled full continuations per state
  value_fn(states)     -> [len(states)] float            value-model scores of states
  reward_fn(programs)  -> [len(programs)] float in [0,1] verified rewards of finished programs

A state is the prompt plus the lines chosen so far (it ends in "\\n" or is the bare prompt).
`search` grows one tree. `search_batch` grows one tree per problem in lockstep, and it makes one
expand_fn call and one value_fn (or reward_fn) call per iteration across all the trees.
`mctx` does not fit this search. It assumes a fixed number of actions per node and a jitted
recurrent function over embeddings. Here an action is a sampled line of variable text, and equal
lines merge into one child, so a node has a variable number of children. A visibility rule then
keeps only the top `num_decision` of them selectable.

  step         one line. Expanding node u samples `num_samples` continuations of u.state; a
               sample's action is its first line, "\\n" included (the whole text if it has no
               "\\n"). Samples with the same action (and terminality) merge into one child
               u.state + action, which owns all of them. A sample with nothing after its first
               line (exactly one line, or empty) gives a terminal child: its state is a finished
               program, never expanded. The same line as a terminal and as a non-terminal action
               gives two children. Only the top `num_decision` children by V are visible
               (selectable). The others stay in the tree with their values.
  selection    from the root, the visible child of maximal
                   UCT(child) = V(child) + c * sqrt((1 + ln N_parent) / (eps + n_child)),
               with ties going to the first child created, down to an unexpanded or terminal node.
  leaf values  each sample s drawn when expanding u gets one leaf value x_s. With `reward_fn`,
               x_s is the verified reward of its program u.state + s.text. With `value_fn`, x_s
               is value_fn(child.state) of the child it produced (one call per child, shared by
               merged samples; a terminal child's state is its program).
  backup       the child gets its samples' values (n_child = their count). u and every ancestor
               add n visits and sum(x). V = value_sum / value_count, which is the running mean
               of all leaf values below a node, each sample counted once: the node's own samples
               (those that produced it) and every descendant's. With `reward_fn` this is exactly
               the Monte-Carlo value target: the mean verified reward of the completions below the
               node, and a terminal node's own reward. Selecting a terminal node adds one visit to
               each node on the path, so UCT moves on, but no value, so V stays that mean. The
               authors instead back up V again, which would weight the targets toward revisited
               terminals.
  answer       the program of the highest-V terminal node, visible or not. With no terminal node,
               take the highest-V non-root node and complete its state with the best sample below
               it: the sample of highest leaf value among those owned by it and its descendants.
               Ties go to the first in pre-order, and then to the first drawn.
  budget       before each iteration a tree checks the generated tokens it has spent (the sum of
               `Sample.tokens`). It stops once they reach `token_budget`, or when `iterations` run
               out. One expansion is all or nothing, so a search ends with tokens_spent <
               token_budget + (cost of its last expansion): it overshoots by less than one
               expansion. `best_of_n` follows the same rule per expand_fn call.

Two modes share the one loop. The caller picks the mode by the scorer it passes.
  value targets  (training-time search) `reward_fn=verify`, with `COLLECTION_CONFIG` (100
                 iterations, c = 0.2, eps = 0.1). `SearchResult.targets` holds the (state, MC
                 target) pairs that train the value model.
  decoding       (test time, VM-MCTS) `value_fn=value_model`, with `DECODING_CONFIG` (15
                 iterations, c = 0.1). reward_fn is never called.
  ORM-MCTS       the same search with an outcome reward model as `value_fn`, which then scores
                 the new nodes' states. The authors' ORM test phase is what `reward_fn=orm` gives:
                 it scores every sample's full program, as training-time search does with
                 verified rewards.

The authors differ in two ways. Their training-time children start unvisited with V = 0, so their
top-`num_decision` cut sees only ties; here a new child takes its samples' rewards at once. At test
time they return the best value-model score over every sampled completion, not a terminal node.

Baselines at equal token budget share these callables. Greedy decoding is left to the caller.
`best_of_n` samples until the budget is spent and keeps the best by a score: ORM-BoN uses
`orm_scores` (an outcome value of each full program), and PRM-BoN uses `prm_scores` (the minimum
of value_fn over a sample's line prefixes, the value model used as a process reward).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import numpy as np


class Sample(NamedTuple):
    """One sampled continuation: its text (to EOS, possibly several lines) and its cost."""

    text: str
    tokens: int  # generated tokens it cost


ExpandFn = Callable[[list[str], int], Sequence[Sequence[Sample]]]
ScoreFn = Callable[[list[str]], np.ndarray]  # value_fn (states), reward_fn / ORM (programs)


@dataclasses.dataclass(frozen=True)
class MCTSConfig:
    """Search settings. The defaults are the authors' test-time decoding
    (`DECODING_CONFIG`)."""

    iterations: int = 15  # selections per tree (an iteration on a terminal node costs no tokens)
    c: float = 0.1  # UCT exploration constant (0.2 for value-target collection)
    eps: float = 0.1  # UCT epsilon in the denominator eps + n_child
    num_samples: int = 5  # continuations sampled per expansion
    num_decision: int = 3  # children kept visible (selectable) per node: the top ones by V
    token_budget: int | None = None  # stop a tree once it has spent this many generated tokens

    def __post_init__(self):
        if self.iterations < 1:
            raise ValueError(f"MCTSConfig.iterations must be >= 1, got {self.iterations}")
        if self.c < 0:
            raise ValueError(f"MCTSConfig.c must be >= 0, got {self.c}")
        if self.eps <= 0:
            raise ValueError(f"MCTSConfig.eps must be > 0, got {self.eps}")
        if self.num_samples < 1:
            raise ValueError(f"MCTSConfig.num_samples must be >= 1, got {self.num_samples}")
        if self.num_decision < 1:
            raise ValueError(f"MCTSConfig.num_decision must be >= 1, got {self.num_decision}")
        if self.token_budget is not None and self.token_budget < 1:
            raise ValueError(f"MCTSConfig.token_budget must be >= 1 or None, got "
                             f"{self.token_budget}")


DECODING_CONFIG = MCTSConfig()
COLLECTION_CONFIG = MCTSConfig(iterations=100, c=0.2, eps=0.1)


@dataclasses.dataclass(eq=False)
class Node:
    """A tree node: a state plus the search statistics of the leaf values below it."""

    state: str
    terminal: bool = False  # the state is a finished program
    parent: Node | None = None
    visible: bool = True  # selectable: among its parent's top `num_decision` children by V
    children: dict[tuple[str, bool], Node] = dataclasses.field(default_factory=dict)
    programs: list[str] = dataclasses.field(default_factory=list)  # full programs of own samples
    leaf_values: list[float] = dataclasses.field(default_factory=list)  # their leaf values
    visits: int = 0  # N: samples below it plus terminal revisits
    value_sum: float = 0.0  # sum of the leaf values below it
    value_count: int = 0  # number of those leaf values (samples below it)

    @property
    def value(self) -> float:
        """V: the mean leaf value below the node (0 before it has any)."""
        return self.value_sum / self.value_count if self.value_count else 0.0


class SearchResult(NamedTuple):
    """One tree's outcome. `targets` are value targets when the search ran with `reward_fn`."""

    program: str  # the answer (module docstring, "answer")
    value: float  # V of the node it was read from
    tokens: int  # generated tokens spent
    iterations: int  # iterations run
    nodes: int  # nodes in the tree, root included
    targets: list[tuple[str, float]]  # (state, V) of every node with a value, pre-order
    root: Node


class BestOfN(NamedTuple):
    program: str  # prompt + the best sample's text
    score: float  # its score
    tokens: int  # generated tokens spent
    num_samples: int  # samples drawn


def uct(value, visits, parent_visits, c: float, eps: float) -> np.ndarray:
    """UCT = V + c * sqrt((1 + ln N_parent) / (eps + n)); value, visits [K] -> [K]."""
    visits = np.asarray(visits, np.float64)
    return np.asarray(value, np.float64) + c * np.sqrt(
        (1.0 + np.log(parent_visits)) / (eps + visits))


def split_first_line(text: str) -> tuple[str, str]:
    """(first line with its "\\n", the rest); a text with no "\\n" is all first line."""
    end = text.find("\n") + 1 or len(text)
    return text[:end], text[end:]


def line_prefixes(text: str) -> list[str]:
    """The text cut after each of its lines ("a\\nb" -> ["a\\n", "a\\nb"]); [""] for ""."""
    ends = [i + 1 for i, ch in enumerate(text) if ch == "\n"]
    if not ends or ends[-1] < len(text):
        ends.append(len(text))
    return [text[:e] for e in ends]


def walk(node: Node) -> Iterator[Node]:
    """The subtree in pre-order (children in creation order)."""
    yield node
    for child in node.children.values():
        yield from walk(child)


def select(root: Node, c: float, eps: float) -> Node:
    """Descend by max UCT over visible children to an unexpanded or terminal node."""
    node = root
    while node.children and not node.terminal:
        kids = [k for k in node.children.values() if k.visible]
        scores = uct([k.value for k in kids], [k.visits for k in kids], node.visits, c, eps)
        node = kids[int(np.argmax(scores))]
    return node


def value_targets(root: Node) -> list[tuple[str, float]]:
    """(state, V) of every node that has leaf values below it, in pre-order."""
    return [(n.state, n.value) for n in walk(root) if n.value_count]


def answer(root: Node) -> tuple[str, float]:
    """(program, V): the highest-V terminal node's program; with no terminal node, the highest-V
    node's state completed by the best-leaf-value sample it or a descendant owns."""
    nodes = list(walk(root))[1:]
    if not nodes:
        return root.state, 0.0
    terminals = [n for n in nodes if n.terminal]
    if terminals:
        best = max(terminals, key=lambda n: n.value)
        return best.state, best.value
    best = max(nodes, key=lambda n: n.value)
    owned = [(x, p) for n in walk(best) for p, x in zip(n.programs, n.leaf_values, strict=True)]
    return max(owned, key=lambda xp: xp[0])[1], best.value


def _add_samples(node: Node, samples: Sequence[Sample]) -> list[Node]:
    """Create `node`'s children from its samples (merging equal actions); the child per sample."""
    owners = []
    for s in samples:
        action, rest = split_first_line(s.text)
        key = (action, rest == "")
        if key not in node.children:
            node.children[key] = Node(node.state + action, terminal=key[1], parent=node)
        owners.append(node.children[key])
    return owners


def _record(node: Node, samples: Sequence[Sample], owners: list[Node], values: np.ndarray,
            num_decision: int) -> None:
    """Give each child its samples' leaf values, hide all but the top `num_decision` children by
    V, and back the values up from `node` to the root."""
    for s, child, x in zip(samples, owners, values, strict=True):
        child.programs.append(node.state + s.text)
        child.leaf_values.append(float(x))
        child.visits += 1
        child.value_sum += float(x)
        child.value_count += 1
    ranked = sorted(node.children.values(), key=lambda k: -k.value)  # stable: ties keep order
    for k in ranked[num_decision:]:
        k.visible = False
    up: Node | None = node
    while up is not None:
        up.visits += len(samples)
        up.value_sum += float(np.sum(values))
        up.value_count += len(samples)
        up = up.parent


def _visit(node: Node) -> None:
    """A terminal node was selected again: one more visit on its path, no new value."""
    up: Node | None = node
    while up is not None:
        up.visits += 1
        up = up.parent


def _checked_samples(out, num_states: int) -> list[list[Sample]]:
    out = [list(ss) for ss in out]
    if len(out) != num_states:
        raise ValueError(f"expand_fn returned {len(out)} sample lists for {num_states} states")
    if any(not ss for ss in out):
        raise ValueError("expand_fn returned an empty sample list")
    return out


def _checked_scores(x, n: int, name: str) -> np.ndarray:
    x = np.asarray(x, np.float64)
    if x.shape != (n,):
        raise ValueError(f"{name} returned shape {x.shape} for {n} inputs, expected ({n},)")
    return x


def _split(flat: np.ndarray, sizes: Sequence[int]) -> list[np.ndarray]:
    return np.split(flat, np.cumsum(sizes)[:-1])


def search_batch(prompts: Sequence[str], expand_fn: ExpandFn, config: MCTSConfig = DECODING_CONFIG,
                 *, value_fn: ScoreFn | None = None,
                 reward_fn: ScoreFn | None = None) -> list[SearchResult]:
    """One tree per prompt, grown in lockstep: per iteration, one expand_fn call for the leaves of
    every tree still within its budget, and one value_fn (or reward_fn) call for their new nodes
    (or samples' programs). Pass exactly one of value_fn (test-time decoding, ORM-MCTS) or
    reward_fn (value-target collection). Returns one `SearchResult` per prompt.
    """
    if (value_fn is None) == (reward_fn is None):
        raise ValueError("pass exactly one of value_fn (decoding) or reward_fn (value targets)")
    roots = [Node(p) for p in prompts]
    tokens, iterations = [0] * len(roots), [0] * len(roots)
    budget = config.token_budget
    for _ in range(config.iterations):
        active = [b for b in range(len(roots)) if budget is None or tokens[b] < budget]
        if not active:
            break
        leaves = {b: select(roots[b], config.c, config.eps) for b in active}
        for b in active:
            iterations[b] += 1
            if leaves[b].terminal:
                _visit(leaves[b])
        grow = [b for b in active if not leaves[b].terminal]
        if not grow:
            continue
        samples = _checked_samples(
            expand_fn([leaves[b].state for b in grow], config.num_samples), len(grow))
        owners = [_add_samples(leaves[b], ss) for b, ss in zip(grow, samples, strict=True)]
        if reward_fn is not None:  # x = verified reward of each sample's program
            programs = [leaves[b].state + s.text
                        for b, ss in zip(grow, samples, strict=True) for s in ss]
            flat = _checked_scores(reward_fn(programs), len(programs), "reward_fn")
            values = _split(flat, [len(ss) for ss in samples])
        else:  # x = value of the child each sample produced
            kids = [k for b in grow for k in leaves[b].children.values()]  # all new
            flat = _checked_scores(value_fn([k.state for k in kids]), len(kids), "value_fn")
            by_kid = dict(zip(kids, flat, strict=True))
            values = [np.array([by_kid[k] for k in ow]) for ow in owners]
        for b, ss, ow, x in zip(grow, samples, owners, values, strict=True):
            _record(leaves[b], ss, ow, x, config.num_decision)
            tokens[b] += sum(s.tokens for s in ss)
    results = []
    for root, spent, its in zip(roots, tokens, iterations, strict=True):
        program, value = answer(root)
        results.append(SearchResult(program, value, spent, its, sum(1 for _ in walk(root)),
                                    value_targets(root), root))
    return results


def search(prompt: str, expand_fn: ExpandFn, config: MCTSConfig = DECODING_CONFIG, *,
           value_fn: ScoreFn | None = None, reward_fn: ScoreFn | None = None) -> SearchResult:
    """One tree (the loop of `search_batch` on a single prompt): one leaf expanded per iteration,
    its samples scored in one call."""
    return search_batch([prompt], expand_fn, config, value_fn=value_fn, reward_fn=reward_fn)[0]


BUDGET_DECODERS = ("orm_bon", "prm_bon", "orm_mcts", "vm_mcts")


def decode_at_budgets(prompts: Sequence[str], expand_fn: ExpandFn, budgets: Sequence[int], *,
                      vm_fn: ScoreFn, orm_fn: ScoreFn, config: MCTSConfig = DECODING_CONFIG,
                      decoders: Sequence[str] = BUDGET_DECODERS
                      ) -> dict[str, list[list[BestOfN | SearchResult]]]:
    """ReST-RL's test-time decoders at equal token budgets (greedy decoding is the caller's):
    per decoder (in `decoders` order) and budget (in order), one pick per prompt. orm_bon:
    `best_of_n` by `orm_scores` of the outcome model `orm_fn`; prm_bon: `best_of_n` by
    `prm_scores` of the value model `vm_fn`; orm_mcts / vm_mcts: `search_batch` guided by
    `orm_fn` / `vm_fn` under `config` with token_budget = the budget."""
    unknown = [d for d in decoders if d not in BUDGET_DECODERS]
    if unknown:
        raise ValueError(f"unknown decoders {unknown}; known: {list(BUDGET_DECODERS)}")
    scorers = {"orm_bon": functools.partial(orm_scores, orm_fn=orm_fn),
               "prm_bon": functools.partial(prm_scores, value_fn=vm_fn)}
    guides = {"orm_mcts": orm_fn, "vm_mcts": vm_fn}
    out: dict[str, list[list[BestOfN | SearchResult]]] = {}
    for name in decoders:
        out[name] = [best_of_n(prompts, expand_fn, scorers[name], budget) if name in scorers else
                     search_batch(prompts, expand_fn,
                                  dataclasses.replace(config, token_budget=budget),
                                  value_fn=guides[name]) for budget in budgets]
    return out


def preference_pairs(results: Sequence[SearchResult], margin: float
                     ) -> list[tuple[str, str, str]]:
    """(state, chosen, rejected) preference pairs from searched trees (COS(M+O)S's ORPO data,
    Materzok 2025, arXiv 2501.17104): at every node with at least two children that own samples,
    the first sample's continuation (its text after the node's state) of the highest-V child
    against that of the lowest-V child (the first child of each in creation order on ties),
    kept when V_hi - V_lo >= `margin` and neither continuation is blank. Trees in order, nodes
    in pre-order."""
    out = []
    for result in results:
        for node in walk(result.root):
            kids = [c for c in node.children.values() if c.programs]
            if len(kids) < 2:
                continue
            hi, lo = max(kids, key=lambda c: c.value), min(kids, key=lambda c: c.value)
            chosen = hi.programs[0][len(node.state):]
            rejected = lo.programs[0][len(node.state):]
            if hi.value - lo.value >= margin and chosen.strip() and rejected.strip():
                out.append((node.state, chosen, rejected))
    return out


def prm_scores(prompt: str, samples: Sequence[Sample], value_fn: ScoreFn) -> np.ndarray:
    """PRM score [S] of each sample: min over its line prefixes p of value_fn(prompt + p) (an
    empty sample scores value_fn(prompt)); one batched value_fn call."""
    prefixes = [[prompt + p for p in line_prefixes(s.text)] for s in samples]
    flat = [p for ps in prefixes for p in ps]
    values = _checked_scores(value_fn(flat), len(flat), "value_fn")
    return np.array([v.min() for v in _split(values, [len(ps) for ps in prefixes])])


def orm_scores(prompt: str, samples: Sequence[Sample], orm_fn: ScoreFn) -> np.ndarray:
    """ORM score [S] of each sample: orm_fn of its full program prompt + text."""
    return _checked_scores(orm_fn([prompt + s.text for s in samples]), len(samples), "orm_fn")


def best_of_n(prompts: Sequence[str], expand_fn: ExpandFn,
              score_fn: Callable[[str, list[Sample]], np.ndarray], budget: int, *,
              num_samples: int = 5) -> list[BestOfN]:
    """Best-of-n at a token budget: expand_fn(prompts still under budget, num_samples) until each
    prompt has spent >= `budget` generated tokens (overshooting by less than one call's cost),
    then the sample of max score_fn(prompt, samples) [S] (first on ties). ORM-BoN:
    score_fn = partial(orm_scores, orm_fn=orm); PRM-BoN: partial(prm_scores, value_fn=vm).
    """
    if budget < 1:
        raise ValueError(f"best_of_n budget must be >= 1, got {budget}")
    if num_samples < 1:
        raise ValueError(f"best_of_n num_samples must be >= 1, got {num_samples}")
    drawn: list[list[Sample]] = [[] for _ in prompts]
    spent = [0] * len(prompts)
    while active := [b for b in range(len(prompts)) if spent[b] < budget]:
        out = _checked_samples(expand_fn([prompts[b] for b in active], num_samples), len(active))
        for b, ss in zip(active, out, strict=True):
            cost = sum(s.tokens for s in ss)
            if cost <= 0:
                raise ValueError("expand_fn returned samples costing 0 tokens: the budget would "
                                 "never be spent")
            drawn[b].extend(ss)
            spent[b] += cost
    results = []
    for prompt, ss, cost in zip(prompts, drawn, spent, strict=True):
        scores = _checked_scores(score_fn(prompt, ss), len(ss), "score_fn")
        best = int(np.argmax(scores))
        results.append(BestOfN(prompt + ss[best].text, float(scores[best]), cost, len(ss)))
    return results


__all__ = [
    "BUDGET_DECODERS", "COLLECTION_CONFIG", "DECODING_CONFIG", "BestOfN", "MCTSConfig", "Node",
    "Sample", "SearchResult", "answer", "best_of_n", "decode_at_budgets", "line_prefixes",
    "orm_scores", "preference_pairs", "prm_scores", "search", "search_batch", "select",
    "split_first_line", "uct", "value_targets", "walk",
]
