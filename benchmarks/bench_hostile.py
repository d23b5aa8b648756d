"""Hostile model output: seconds to reject junk, huge and odd-Unicode completions, each against an
ordinary input of the same function, timed alternately in one process.

    python benchmarks/bench_hostile.py            # 5 repeats
    python benchmarks/bench_hostile.py --smoke    # 1 repeat (what the tests run)

The tests check what these inputs give (a tool error, score 0, a value in range); whether that is
fast is a timing claim, measured here instead of asserted there (a loaded test runner makes a
wall-clock assert fail whatever the code does). Per case: the ordinary input and each hostile input
run alternately (ordinary, hostile, ordinary, hostile, ...) for `repeats` rounds; the figure of a
hostile input is its median over the rounds, and its ratio the median over the rounds of hostile
/ ordinary. The table gives each case's slowest hostile input, its ratio and the wall-clock
limit the test once asserted (`limit`): a figure far below the limit says the guard (length caps,
exponent checks, linear scans) works; one near it, on a quiet machine, is a regression.

Cases (and the tests that check their results):
  calculator  every refused expression of the calculator tool (exponent and result caps, length,
              syntax), vs "12*(3+4)"                             tests/envs/test_tools_calculator.py
  countdown   megabyte-long garbage, raw and inside <answer>, vs the right answer
                                                                       tests/envs/test_countdown.py
  composite   a megabyte-long unterminated screening answer, vs an ordinary one
                                                                    tests/rewards/test_composite.py
  aepo        junk point lists (200k-character numbers, parentheses, 10,000 answers), vs a valid
              list                                                       tests/rewards/test_aepo.py
  tasks       ten tasks' score + feedback + reward on junk completions, vs their own solutions
  verifiers   the reward verifiers on the same junk, vs "<answer>579</answer>"
                                                                    tests/rewards/test_hostile.py
  gui         `GuiTask.verify_batch` of 211 junk completions, vs 211 solutions
                                                                           tests/envs/test_gui.py
  facts       BM25 search with a 10,000-character query, vs the name alone; and a rebuild of the
              fact world (absolute seconds: it has no ordinary counterpart)
                                                                         tests/envs/test_facts.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from jaxrl_suite.envs.text import (
    AgNewsTask,
    ArithmeticTask,
    CountdownMeta,
    CountdownTask,
    Example,
    Gsm8kTask,
    IterationMix,
    JsonlTask,
    SortTask,
    TriviaQaTask,
)
from jaxrl_suite.envs.text.facts import FactsQATask, FactWorld, build_world, world_retriever
from jaxrl_suite.envs.text.gui import GuiTask
from jaxrl_suite.envs.text.tools.base import ToolError
from jaxrl_suite.envs.text.tools.calculator import MAX_EXPR_CHARS, calculator
from jaxrl_suite.rewards import (
    exact_match,
    expression_reward,
    extract_answer,
    format_reward,
    normalize_answer,
    numeric_match,
    parse_number,
    string_match,
    token_f1,
)
from jaxrl_suite.rewards.aepo import BAD_REWARD, aepo_text_reward
from jaxrl_suite.rewards.composite import CompositeConfig, composite_components

HUGE = 200_000
_rng = np.random.default_rng(0)

CALC_REFUSED = [
    "2**10**10", "9**9**9", "2**65", "99999**64", "10**31", "10**30+1", "10**20*10**20", "1e999",
    "9" * 150, "(-8)**(1/3)", "1/0", "0**-1", "9" * 400, "1+" * 100 + "1", "(" * 199 + ")",
    "import os", "lambda: 1", "'a'*3", "1<<5",
]
assert max(map(len, CALC_REFUSED)) > MAX_EXPR_CHARS  # the length cap is among the cases

JUNK = [  # the completions of tests/rewards/test_hostile.py
    "", " ", "\x00" * 1000, "<answer>", "</answer>", "<answer>" * 10_000, "</answer>" * 10_000,
    bytes(_rng.integers(0, 256, 5000, dtype=np.uint8)).decode("latin-1"),
    "<answer>" + "9" * HUGE + "</answer>",
    "<answer>" + "(" * HUGE + "</answer>",
    "<answer>" + "(" * 15 + "1" + ")" * 15 + "</answer>",
    "<answer>" + "1+" * (HUGE // 2) + "1</answer>",
    "<answer>" + "the a " * (HUGE // 6) + "</answer>",
    "<answer>" + "1," * (HUGE // 2) + "</answer>",
    "x" * HUGE,
    "<answer>٣²①Ⅻ１２</answer>", "<answer>\ud800\udfff</answer>", "<answer>\u202e12\u202c</answer>",
    "<answer>1e999999</answer>", "<answer>9**9**9**9</answer>",
    "<answer>" + "9" * 99 + "*" + "9" + "</answer>",
]

AEPO_BOX = (10, 20, 30, 25)
AEPO_JUNK = [
    "\x00" * 1000, "<answer>" * 10_000,
    "<answer>" + "(1,2)," * (HUGE // 6) + "(1,2)</answer>",
    "<answer>(" + "9" * HUGE + ",1)</answer>",
    "<answer>" + "(" * HUGE + "</answer>",
    "<answer>" + " " * HUGE + "(1,2)</answer>",
    "x" * HUGE, "<answer>(1,2)</answer>" * 10_000,
    "<answer>__import__('os').system('ls')</answer>",
]


def _ex(answer, meta):
    return Example(prompt="q", answer=answer, meta=meta)


def _tasks():
    sort = SortTask(num_items=4, seed=0)
    tasks = [
        (ArithmeticTask(digits=3), None), (CountdownTask(num_numbers=4), None),
        (CountdownTask(num_numbers=4, graded=True), None), (sort, None),
        (IterationMix(base=sort), None), (Gsm8kTask(), _ex("72", ("steps",))),
        (AgNewsTask(), _ex("Sports", (1, ("World", "Sports", "Business", "Sci/Tech")))),
        (TriviaQaTask(metric="em"), _ex("Eiffel Tower", ("Eiffel Tower", "tour eiffel"))),
        (TriviaQaTask(metric="f1"), _ex("Eiffel Tower", ("Eiffel Tower", "tour eiffel"))),
        (JsonlTask(path="unused.jsonl"), _ex("1,234", ("1,234", "one thousand"))),
    ]
    return [(t, ex if ex is not None else t.example("train", 0)) for t, ex in tasks]


def _score_task(task, ex, completion):
    score = task.score(completion, ex)
    assert 0.0 <= score <= 1.0
    assert isinstance(task.feedback(completion, ex), str)
    return task.reward(completion, ex, format_weight=0.5)


VERIFIERS = [
    lambda c: string_match(c, "579"), lambda c: numeric_match(c, "72"),
    lambda c: exact_match(c, "Eiffel Tower"), lambda c: token_f1(c, "Eiffel Tower"),
    lambda c: expression_reward(c, (3, 5, 7), 56, graded=True),
]


def _verify(completion):
    content = extract_answer(completion)
    out = [format_reward(completion)]
    for x in (content, completion):
        out += [v(x) for v in VERIFIERS]
    assert all(0.0 <= v <= 1.0 for v in out)
    assert isinstance(normalize_answer(completion), str)
    parse_number(completion)
    return out


def _label(expr):
    return repr(expr) if len(expr) <= 12 else f"{expr[:8]!r}... ({len(expr)} chars)"


def _refused(expr):
    try:
        calculator({"expr": expr}, None)
    except ToolError:
        return True
    raise AssertionError(f"the calculator accepted {expr[:40]!r}")


def cases() -> list[tuple[str, Callable[[], object], dict[str, Callable[[], object]], float,
                          str]]:
    """(name, ordinary input, {label: hostile input}, the test's old limit in s, what it bounded)
    with every callable checking its own result (an AssertionError if a guard failed)."""
    out = []
    out.append(("calculator", lambda: calculator({"expr": "12*(3+4)"}, None),
                {_label(e): (lambda e=e: _refused(e)) for e in CALC_REFUSED}, 0.5,
                "each expression"))

    cd_ex = Example(prompt="3 5 7->56:", answer="56", meta=CountdownMeta((3, 5, 7), 56, "(3+5)*7"))
    cd = CountdownTask()
    long_answer = "<answer>" + "7*" * 500_000 + "</answer>"
    garbage = ["(" * 10**6, "1+" * 500_000, long_answer, "x" * 10**6, "<answer>" * 125_000]

    def countdown_all():
        for text in garbage:
            assert cd.score(text, cd_ex) == 0.0
            assert cd.score(f"<answer>{text}</answer>", cd_ex) == 0.0

    out.append(("countdown", lambda: cd.score("<answer>(3+5)*7</answer>", cd_ex),
                {"10 MB of garbage": countdown_all}, 1.0, "all ten"))

    cfg = CompositeConfig()
    big = "<answer>SELECTED|8|" + "a|" * 500_000

    def composite_big():
        assert composite_components(big, "REJECTED", cfg)["format"] == 0.0

    out.append(("composite", lambda: composite_components("<answer>SELECTED|8|x</answer>",
                                                          "REJECTED", cfg),
                {"1 MB unterminated": composite_big}, 1.0, "the megabyte"))

    def aepo_bad(text):
        r = aepo_text_reward(text, AEPO_BOX)
        assert r.reward == BAD_REWARD and r.format == 0.0

    out.append(("aepo", lambda: aepo_text_reward("<answer>(11,21),(50,60)</answer>", AEPO_BOX),
                {f"junk {i}": (lambda t=t: aepo_bad(t)) for i, t in enumerate(AEPO_JUNK)}, 0.5,
                "each completion"))

    tasks = _tasks()

    def tasks_on(texts):
        return lambda: [_score_task(t, ex, c) for t, ex in tasks for c in texts(t, ex)]

    out.append(("tasks", tasks_on(lambda t, ex: [t.solution(ex)]),
                {f"junk {i}": tasks_on(lambda t, ex, c=c: [c]) for i, c in enumerate(JUNK)},
                2.0 * len(tasks), "one completion, all tasks"))
    out.append(("verifiers", lambda: _verify("<answer>579</answer>"),
                {f"junk {i}": (lambda c=c: _verify(c)) for i, c in enumerate(JUNK)}, 2.0,
                "each completion"))

    gui = GuiTask(mode="multi", reward="aepo")
    test = gui.examples("test", 0, 211)
    rng = np.random.default_rng(1)
    gui_junk = ["", "<answer>", "x" * HUGE, "<answer>" + "(1,2)," * (HUGE // 6) + "(1,2)</answer>",
                "<answer>(" + "9" * HUGE + ",9)</answer>", "\x00\xff" * 1000] + [
        bytes(rng.integers(0, 256, int(rng.integers(0, 60)), dtype=np.uint8)).decode("latin-1")
        for _ in range(205)]
    solutions = [gui.solution(ex) for ex in test]

    def gui_junk_batch():
        assert gui.verify_batch(gui_junk, test).scores == [0.0] * len(test)

    out.append(("gui", lambda: gui.verify_batch(solutions, test),
                {"211 junk completions": gui_junk_batch}, 2.0, "the batch"))

    world = FactsQATask().world
    r = world_retriever(world)
    person = world.names["person"][0]
    long_query = "zzz " * 2500 + person

    def search_long():
        assert world.passages[r.search(long_query, 1)[0]].startswith(person)

    out.append(("facts search", lambda: r.search(person, 1),
                {"10k-character query": search_long}, 0.5, "the query"))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--out", type=Path, default=Path("results/bench_hostile.json"))
    args = ap.parse_args()
    repeats = args.repeats or (1 if args.smoke else 5)

    def timed(fn):
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    rows = []
    print(f"hostile inputs: {repeats} alternating rounds per input, {os.cpu_count()} CPU cores")
    print(f"{'case':<13} {'ordinary s':>11} {'slowest hostile input':<28} {'hostile s':>10} "
          f"{'vs ordinary':>12} {'old limit':>10}")
    for name, ordinary, hostile, limit, what in cases():
        ordinary()  # warm-up: imports, caches, regex compilation
        per_input = {}
        for label, fn in hostile.items():
            fn()
            pairs = [(timed(ordinary), timed(fn)) for _ in range(repeats)]
            per_input[label] = {"seconds": statistics.median(h for _, h in pairs),
                                "ordinary_s": statistics.median(o for o, _ in pairs),
                                "ratio": statistics.median(h / max(o, 1e-9) for o, h in pairs)}
        worst = max(per_input, key=lambda k: per_input[k]["seconds"])
        w = per_input[worst]
        rows.append({"case": name, "slowest": worst, "seconds": w["seconds"],
                     "ordinary_s": w["ordinary_s"], "ratio": w["ratio"], "limit_s": limit,
                     "limit_of": what, "inputs": per_input})
        print(f"{name:<13} {w['ordinary_s']:>11.2e} {worst:<28} {w['seconds']:>10.2e} "
              f"{w['ratio']:>11.3g}x {limit:>9.1f}s")

    # the fact world's rebuild (not the cache): absolute seconds, against the old 0.2 s limit
    rebuild = [timed(lambda: build_world.__wrapped__(FactWorld(), 0)) for _ in range(repeats)]
    rebuild_s = statistics.median(rebuild)
    print(f"{'facts world':<13} {'-':>11} {'rebuild (seed 0)':<28} {rebuild_s:>10.2e} "
          f"{'-':>12} {0.2:>9.1f}s")
    figures = {"repeats": repeats, "cases": rows, "facts_rebuild_s": rebuild_s,
               "facts_rebuild_limit_s": 0.2, "cpu_count": os.cpu_count(), "checked": True}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
