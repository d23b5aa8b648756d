"""VM-MCTS over lines (sampling/mcts.py): UCT, merging, visibility, terminals, MC value targets,
the token budget, test-time search against greedy, batched search against single trees, and the
best-of-n baselines, all with deterministic fake callables."""

import dataclasses
import functools
import math
import zlib

import numpy as np
import pytest

from jaxrl_suite.sampling.mcts import (
    COLLECTION_CONFIG,
    DECODING_CONFIG,
    MCTSConfig,
    Node,
    Sample,
    SearchResult,
    best_of_n,
    decode_at_budgets,
    line_prefixes,
    orm_scores,
    preference_pairs,
    prm_scores,
    search,
    search_batch,
    select,
    split_first_line,
    uct,
    walk,
)

P = "P\n"


def _table_expand(table, default=("end\n",), calls=None):
    """expand_fn reading fixed samples per state (cycled to n); tokens = characters."""

    def expand_fn(states, n):
        if calls is not None:
            calls.append(list(states))
        out = []
        for s in states:
            texts = list(table.get(s, default))
            out.append([Sample(texts[i % len(texts)], max(1, len(texts[i % len(texts)])))
                        for i in range(n)])
        return out

    return expand_fn


def _table_fn(table, default=0.0, calls=None):
    def fn(xs):
        if calls is not None:
            calls.append(list(xs))
        return np.array([table.get(x, default) for x in xs])

    return fn


def _hash_expand(calls=None):
    """A pseudo-random LM: samples depend only on the state, never on the batch."""
    vocab = ["a\n", "b\n", "c\n", "d\n"]

    def expand_fn(states, n):
        if calls is not None:
            calls.append(list(states))
        out = []
        for s in states:
            rng = np.random.default_rng(zlib.crc32(s.encode()))
            ss = []
            for _ in range(n):
                k = int(rng.integers(1, 4)) if s.count("\n") < 6 else 1
                text = "".join(vocab[i] for i in rng.integers(0, 4, size=k))
                ss.append(Sample(text, int(rng.integers(1, 5)) * k))
            out.append(ss)
        return out

    return expand_fn


def _hash_value(xs):
    return np.array([x.count("a\n") / max(1, x.count("\n")) + (zlib.crc32(x.encode()) % 97) / 1e4
                     for x in xs])


def _hash_reward(xs):
    return np.array([float(x.count("a\n") >= 2) for x in xs])


def test_uct_matches_hand_computation():
    got = uct([0.5, 0.0, 0.25], [2, 1, 0], 3, c=0.2, eps=0.1)
    want = [v + 0.2 * math.sqrt((1 + math.log(3)) / (0.1 + n))
            for v, n in [(0.5, 2), (0.0, 1), (0.25, 0)]]
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_line_helpers():
    assert split_first_line("a\nb\n") == ("a\n", "b\n")
    assert split_first_line("a\n") == ("a\n", "")
    assert split_first_line("a") == ("a", "")
    assert split_first_line("") == ("", "")
    assert line_prefixes("a\nb") == ["a\n", "a\nb"]
    assert line_prefixes("a\nb\n") == ["a\n", "a\nb\n"]
    assert line_prefixes("") == [""]


def test_duplicate_first_lines_merge():
    expand = _table_expand({P: ["a\nx\n", "a\ny\n", "b\nz\n", "a\nx\n", "c\nq\n"]})
    res = search(P, expand, dataclasses.replace(DECODING_CONFIG, iterations=1),
                 value_fn=_table_fn({}))
    kids = res.root.children
    assert list(kids) == [("a\n", False), ("b\n", False), ("c\n", False)]
    a = kids[("a\n", False)]
    assert a.state == "P\na\n" and a.visits == 3 and a.value_count == 3
    assert a.programs == ["P\na\nx\n", "P\na\ny\n", "P\na\nx\n"]
    assert res.root.visits == 5 and res.nodes == 4


def test_one_line_sample_gives_terminal_child():
    expand = _table_expand({P: ["b\n", "", "c", "b\nz\n", "d\ne"]})
    cfg = MCTSConfig(iterations=1, num_decision=5)
    kids = search(P, expand, cfg, value_fn=_table_fn({})).root.children
    assert {k: (n.state, n.terminal) for k, n in kids.items()} == {
        ("b\n", True): ("P\nb\n", True),
        ("", True): ("P\n", True),
        ("c", True): ("P\nc", True),
        ("b\n", False): ("P\nb\n", False),
        ("d\n", False): ("P\nd\n", False),
    }
    for node in kids.values():  # a terminal child's state is its finished program
        assert not node.terminal or node.programs == [node.state]


def test_only_top_num_decision_children_are_selectable():
    lines = [f"l{i}\n" for i in range(5)]
    values = dict(zip((P + s for s in lines), [0.1, 0.5, 0.3, 0.9, 0.7], strict=True))
    expand = _table_expand({P: [s + "more\n" for s in lines]}, default=("z\nz\n",))
    res = search(P, expand, MCTSConfig(iterations=30), value_fn=_table_fn(values, 0.2))
    kids = {n.state: n for n in res.root.children.values()}
    assert {s for s, n in kids.items() if n.visible} == {"P\nl3\n", "P\nl4\n", "P\nl1\n"}
    for s in ("P\nl0\n", "P\nl2\n"):  # hidden: kept with their value, never selected
        assert not kids[s].children and kids[s].visits == 1
        assert kids[s].value == values[s]
    assert all(kids[s].children for s in ("P\nl3\n", "P\nl4\n", "P\nl1\n"))
    # select() ignores hidden children even when their UCT would win
    kids["P\nl0\n"].value_sum = 100.0
    assert select(res.root, 0.1, 0.1).state != "P\nl0\n"


def test_value_targets_are_mc_means_of_verified_rewards():
    expand = _table_expand({P: ["a\nx\n", "a\ny\n", "b\n"], "P\na\n": ["x\n", "y\nq\n", "x\n"]})
    rewards = {"P\na\nx\n": 1.0, "P\na\ny\n": 0.0, "P\nb\n": 0.0, "P\na\ny\nq\n": 0.0}
    reward_calls = []
    cfg = dataclasses.replace(COLLECTION_CONFIG, iterations=3, num_samples=3)
    res = search(P, expand, cfg, reward_fn=_table_fn(rewards, calls=reward_calls))
    # iteration 1 expands the root: A = "P\na\n" owns rewards {1, 0}, B = "P\nb\n" (terminal) {0}.
    # iteration 2: UCT(A) = .5 + .2 sqrt((1 + ln 3) / 2.1) > UCT(B) = .2 sqrt((1 + ln 3) / 1.1);
    # expanding A gives AX = "P\na\nx\n" (terminal, rewards {1, 1}) and AY = "P\na\ny\n" {0}.
    # iteration 3 reaches the terminal AX: a visit, no new reward.
    # targets: root = mean of all six rewards {1, 0, 0, 1, 0, 1}; A = its five {1, 0, 1, 0, 1}
    want = {P: 3 / 6, "P\na\n": 3 / 5, "P\na\nx\n": 1.0, "P\na\ny\n": 0.0, "P\nb\n": 0.0}
    assert dict(res.targets) == pytest.approx(want)
    assert [s for s, _ in res.targets] == [P, "P\na\n", "P\na\nx\n", "P\na\ny\n", "P\nb\n"]
    assert len(reward_calls) == 2 and res.iterations == 3
    visits = {n.state: n.visits for n in walk(res.root)}
    assert visits[P] == 7 and visits["P\na\n"] == 6 and visits["P\na\nx\n"] == 3
    assert res.program == "P\na\nx\n" and res.value == 1.0
    assert res.tokens == sum(len(t) for t in ["a\nx\n", "a\ny\n", "b\n", "x\n", "y\nq\n", "x\n"])


def test_token_budget_stops_within_one_expansion():
    for budget in (1, 7, 23, 60, 150):
        calls = []
        base = _hash_expand()

        def expand(states, n, calls=calls, base=base):
            out = base(states, n)
            calls.append(sum(s.tokens for s in out[0]))
            return out

        cfg = MCTSConfig(iterations=1000, token_budget=budget)
        res = search(P, expand, cfg, value_fn=_hash_value)
        # rule: a tree expands only while tokens < budget, so it ends with
        # budget <= tokens < budget + (cost of its last expansion)
        assert res.tokens == sum(calls)
        assert res.tokens >= budget and res.tokens - calls[-1] < budget
    res = search(P, _hash_expand(), MCTSConfig(iterations=4, token_budget=10**9),
                 value_fn=_hash_value)
    assert res.iterations == 4


def test_test_time_search_beats_greedy_first_sample():
    table = {
        P: ["bug\nret\n", "x1\nx2\nret\n", "x1\nbug\nret\n", "bug\nbug\nret\n", "x1\nx2\nret\n"],
        "P\nx1\n": ["bug\nret\n", "x2\nret\n", "x2\nret\n", "bug\nret\n", "x2\nret\n"],
        "P\nx1\nx2\n": ["ret\n"],
    }
    expand = _table_expand(table, default=("ret\n",))

    def value_fn(states):  # prefers the correct lines
        return np.array([0.1 if "bug" in s else 0.9 for s in states])

    greedy = P + expand([P], 1)[0][0].text
    res = search(P, expand, DECODING_CONFIG, value_fn=value_fn)
    assert greedy == "P\nbug\nret\n"
    assert res.program == "P\nx1\nx2\nret\n" and res.value == pytest.approx(0.9)


def test_answer_without_terminal_completes_best_node():
    expand = _table_expand({P: ["a\nq\n", "b\nq\n"], "P\na\n": ["q\nr\n", "s\nr\n"]})
    values = _table_fn({"P\na\n": 0.6, "P\nb\n": 0.4, "P\na\nq\n": 0.9, "P\na\ns\n": 0.2})
    one = search(P, expand, MCTSConfig(iterations=1, num_samples=2), value_fn=values)
    assert (one.program, one.value) == ("P\na\nq\n", pytest.approx(0.6))
    two = search(P, expand, MCTSConfig(iterations=2, num_samples=2), value_fn=values)
    assert (two.program, two.value) == ("P\na\nq\nr\n", pytest.approx(0.9))
    assert dict(two.targets)["P\na\n"] == pytest.approx((0.6 + 0.9 + 0.2) / 3)


def _child(parent: Node, line: str, value: float, programs: list[str]) -> Node:
    node = Node(parent.state + line, parent=parent, programs=programs, value_sum=value,
                value_count=1)
    parent.children[(line, False)] = node
    return node


def test_decode_at_budgets_equals_the_decoders_called_one_by_one():
    """Each decoder at each budget is its direct call, in decoder-then-budget order (the
    pseudo-random LM is stateless, so the calls may be repeated for the reference)."""
    prompts, budgets = [P, "Q\n"], [6, 12]
    vm, orm = _table_fn({"P\na\n": 0.7, "P\nb\n": 0.2}, 0.5), _table_fn({}, 0.3)
    config = MCTSConfig(iterations=3, c=0.1, eps=0.1, num_samples=2)
    got = decode_at_budgets(prompts, _hash_expand(), budgets, vm_fn=vm, orm_fn=orm, config=config)
    assert list(got) == ["orm_bon", "prm_bon", "orm_mcts", "vm_mcts"]
    for name, picks in got.items():
        assert len(picks) == len(budgets)
        for budget, pick in zip(budgets, picks, strict=True):
            if name.endswith("bon"):
                score = (functools.partial(orm_scores, orm_fn=orm) if name == "orm_bon" else
                         functools.partial(prm_scores, value_fn=vm))
                want = best_of_n(prompts, _hash_expand(), score, budget)
                assert pick == want
            else:
                want = search_batch(prompts, _hash_expand(),
                                    dataclasses.replace(config, token_budget=budget),
                                    value_fn=orm if name == "orm_mcts" else vm)
                assert [(x.program, x.value, x.tokens) for x in pick] == \
                    [(x.program, x.value, x.tokens) for x in want]
    assert list(decode_at_budgets(prompts, _hash_expand(), [6], vm_fn=vm, orm_fn=orm,
                                  decoders=("vm_mcts",))) == ["vm_mcts"]
    with pytest.raises(ValueError, match="unknown decoders"):
        decode_at_budgets(prompts, _hash_expand(), [6], vm_fn=vm, orm_fn=orm, decoders=("x",))


def test_preference_pairs_on_a_hand_built_tree():
    root = Node(P)
    a = _child(root, "a\n", 0.9, ["P\na\nx\n"])
    _child(root, "b\n", 0.6, ["P\nb\nz\n"])
    _child(root, "c\n", 0.3, ["P\nc\ny\n", "P\nc\nw\n"])  # its first sample is paired
    _child(root, "d\n", 0.0, [])  # owns no sample: not a candidate
    _child(a, "q\n", 0.5, ["P\na\nq\n"])
    _child(a, "r\n", 0.1, ["P\na\n  "])  # a blank continuation: no pair at this node
    lone = Node("Q\n")
    _child(lone, "s\n", 1.0, ["Q\ns\n"])  # one child: nothing to compare
    trees = [SearchResult("", 0.0, 0, 0, 0, [], root), SearchResult("", 0.0, 0, 0, 0, [], lone)]
    assert preference_pairs(trees, margin=0.6) == [(P, "a\nx\n", "c\ny\n")]  # 0.9 - 0.3
    assert preference_pairs(trees, margin=0.61) == []
    a.children[("r\n", False)].programs[0] = "P\na\nt\n"
    assert preference_pairs(trees, margin=0.4) == [(P, "a\nx\n", "c\ny\n"),
                                                   ("P\na\n", "q\n", "t\n")]


def test_preference_pairs_from_a_search_pair_its_best_and_worst_children():
    expand = _table_expand({P: ["a\nq\n", "b\nq\n"]})
    values = _table_fn({"P\na\n": 0.8, "P\nb\n": 0.2})
    found = search_batch([P], expand, MCTSConfig(iterations=1, num_samples=2), value_fn=values)
    assert preference_pairs(found, margin=0.5) == [(P, "a\nq\n", "b\nq\n")]


@pytest.mark.parametrize("mode", ["value_fn", "reward_fn"])
def test_search_batch_equals_single_searches(mode):
    prompts = [f"# problem {i}\n" for i in range(4)]
    score = {"value_fn": _hash_value, "reward_fn": _hash_reward}[mode]
    cfg = dataclasses.replace(COLLECTION_CONFIG, iterations=20, token_budget=120)
    single_calls, batch_calls = [], []
    singles = [search(p, _hash_expand(single_calls), cfg, **{mode: score}) for p in prompts]
    batched = search_batch(prompts, _hash_expand(batch_calls), cfg, **{mode: score})
    for s, b in zip(singles, batched, strict=True):
        assert (s.program, s.tokens, s.iterations, s.nodes) == (
            b.program, b.tokens, b.iterations, b.nodes)
        assert s.value == pytest.approx(b.value)
        assert [t for t, _ in s.targets] == [t for t, _ in b.targets]
        np.testing.assert_allclose([v for _, v in s.targets], [v for _, v in b.targets])
    assert len({r.tokens for r in singles}) > 1  # the trees stop at different times
    assert len(batch_calls) < len(single_calls)
    assert len(batch_calls) <= cfg.iterations
    assert max(len(c) for c in batch_calls) == len(prompts)


def test_best_of_n_spends_budget_and_picks_best():
    counter = {}

    def expand(states, n):
        out = []
        for s in states:
            k = counter[s] = counter.get(s, -1) + 1
            cost = 3 if s == P else 5
            out.append([Sample(f"s{k}{j}\n", cost) for j in range(n)])
        return out

    orm = _table_fn({"P\ns10\n": 0.9, "P\ns01\n": 0.5, "Q\ns00\n": 0.2, "Q\ns01\n": 0.7})
    got = best_of_n([P, "Q\n"], expand, functools.partial(orm_scores, orm_fn=orm), 10,
                    num_samples=2)
    # P: 0 -> 6 -> 12 tokens (4 samples); Q: 0 -> 10 (2 samples)
    assert got[0] == ("P\ns10\n", 0.9, 12, 4)
    assert got[1] == ("Q\ns01\n", 0.7, 10, 2)


def test_prm_scores_min_over_line_prefixes():
    calls = []
    vm = _table_fn({"P\na\n": 0.8, "P\na\nb\n": 0.3, "P\na\nb\nc": 0.9, P: 0.5}, calls=calls)
    samples = [Sample("a\nb\nc", 3), Sample("a\n", 1), Sample("", 1)]
    np.testing.assert_allclose(prm_scores(P, samples, vm), [0.3, 0.8, 0.5])
    assert len(calls) == 1  # one batched value_fn call
    prm = functools.partial(prm_scores, value_fn=vm)
    got = best_of_n([P], _table_expand({P: ["a\nb\nc", "a\n"]}), prm, 1, num_samples=2)
    assert got[0].program == "P\na\n" and got[0].score == pytest.approx(0.8)


@pytest.mark.parametrize("field,value", [("iterations", 0), ("c", -0.1), ("eps", 0.0),
                                         ("num_samples", 0), ("num_decision", 0),
                                         ("token_budget", 0)])
def test_bad_config_raises(field, value):
    with pytest.raises(ValueError, match=field):
        MCTSConfig(**{field: value})


def test_bad_arguments_raise():
    expand = _table_expand({})
    with pytest.raises(ValueError, match="exactly one"):
        search(P, expand)
    with pytest.raises(ValueError, match="exactly one"):
        search(P, expand, value_fn=_hash_value, reward_fn=_hash_reward)
    with pytest.raises(ValueError, match="expand_fn"):
        search(P, lambda states, n: [], value_fn=_hash_value)
    with pytest.raises(ValueError, match="value_fn"):
        search(P, expand, value_fn=lambda xs: np.zeros(len(xs) + 1))
