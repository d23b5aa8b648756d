"""envs.text.story: the grammar, the contradiction checker, the bland storyteller and the hidden
quality, against hand-built worlds and plots whose verdicts are worked out by hand."""

import numpy as np
import pytest

from jaxrl_suite.envs.text import Example, make_task
from jaxrl_suite.envs.text.story import (
    CONTRADICTIONS,
    KINDS,
    Goal,
    State,
    Step,
    StoryTask,
    World,
    check_plot,
    parse_step,
    plot_stats,
    render_step,
    split_steps,
    step_contradictions,
)

# Mira and Tam at the well, Ode at the mill holding the key, the lamp on the ground at the mill.
# Goals: Mira wants the lamp (0), Tam wants to reach the tower (1).
W = World(characters=("Mira", "Ode", "Tam"), places=("tower", "mill", "well"),
          items=("lamp", "key"), start_location=("well", "mill", "well"),
          start_item=(("at", "mill"), ("held", "Ode")),
          goals=(Goal("Mira", "item", "lamp"), Goal("Tam", "reach", "tower")))


def played(*sentences: str, world: World = W) -> State:
    """The state after a prelude of sentences, each of which must be coherent."""
    state = world.initial_state()
    for s in sentences:
        step = parse_step(s)
        assert state.contradictions(step) == [], s
        state.apply(step)
    return state


# ---------------------------------------------------------------- grammar

@pytest.mark.parametrize("sentence, step", [
    ("Mira goes to the tower.", Step("go", ("Mira", "tower"))),
    ("Mira takes the lamp.", Step("take", ("Mira", "lamp"))),
    ("Ode drops the key.", Step("drop", ("Ode", "key"))),
    ("Ode gives the key to Tam.", Step("give", ("Ode", "key", "Tam"))),
    ("Tam meets Mira.", Step("meet", ("Tam", "Mira"))),
    ("Tam leaves the story.", Step("leave", ("Tam",))),
    ("A storm floods the mill.", Step("storm", ("mill",))),
    ("The water drains from the well.", Step("drain", ("well",))),
])
def test_parse_and_render_round_trip(sentence, step):
    assert parse_step(sentence) == step
    assert parse_step(f"  {sentence}\n") == step  # surrounding whitespace is ignored
    assert render_step(step) == sentence


def test_the_round_trip_cases_cover_every_kind():
    kinds = {parse_step(s).kind for s in (
        "A goes to the b.", "A takes the b.", "A drops the b.", "A gives the b to C.",
        "A meets B.", "A leaves the story.", "A storm floods the b.",
        "The water drains from the b.")}
    assert kinds == set(KINDS) and len(KINDS) == 8


@pytest.mark.parametrize("sentence", [
    "Mira flies.", "", "   ", "Mira goes to the tower", "Mira goes to the tower..",
    "Mira goes to the old tower.", "Mira goes to the tower now.", "Mira quickly goes to the tower.",
    "Mira goes to the tower.\nTam meets Mira.", "Mira gives the lamp.", "Mira meets.",
    "A storm floods.", "Mira goes to the t0wer.", "Mira takes the lamp!",
])
def test_malformed_sentences_do_not_parse(sentence):
    assert parse_step(sentence) is None


# ---------------------------------------------------------------- the world and its checker

def test_opening_states_the_world():
    assert W.opening() == (
        "At the mill: Ode, the lamp. At the well: Mira, Tam. Ode has the key. "
        "Mira wants the lamp. Tam wants to reach the tower.\n")


CASES = [  # (prelude, step, the exact contradictions)
    ((), None, ["malformed"]),
    ((), "Lio goes to the tower.", ["malformed"]),  # a CHARACTERS name not in this world
    ((), "Mira goes to the cave.", ["malformed"]),
    ((), "Mira takes the map.", ["malformed"]),
    ((), "Mira gives the lamp to Kit.", ["malformed"]),
    ((), "A storm floods the harbor.", ["malformed"]),
    ((), "mira goes to the tower.", ["malformed"]),
    (("Mira leaves the story.",), "Mira goes to the tower.", ["gone"]),
    (("Mira leaves the story.",), "Mira leaves the story.", ["gone"]),
    (("Tam leaves the story.",), "Mira meets Tam.", ["recipient_gone"]),
    (("Tam leaves the story.",), "Mira meets Ode.", ["apart"]),
    ((), "Mira meets Mira.", ["self"]),
    ((), "Ode gives the key to Ode.", ["self"]),
    ((), "Mira meets Ode.", ["apart"]),
    ((), "Ode gives the key to Tam.", ["apart"]),
    ((), "Mira goes to the well.", ["same_place"]),
    (("A storm floods the tower.",), "Tam goes to the tower.", ["flooded"]),
    (("A storm floods the well.",), "Mira goes to the well.", ["same_place", "flooded"]),
    ((), "Ode takes the key.", ["item_held"]),  # oneself included
    ((), "Mira takes the key.", ["item_held"]),
    ((), "Mira takes the lamp.", ["item_elsewhere"]),
    ((), "Mira drops the lamp.", ["not_holding"]),
    ((), "Tam gives the lamp to Mira.", ["not_holding"]),
    (("A storm floods the tower.",), "A storm floods the tower.", ["already_flooded"]),
    ((), "The water drains from the tower.", ["not_flooded"]),
    (("A storm floods the tower.", "The water drains from the tower."),
     "The water drains from the tower.", ["not_flooded"]),
    (("Mira goes to the mill.", "Mira takes the lamp.", "Mira drops the lamp."),
     "Mira takes the lamp.", ["repeat_goal"]),
    (("Mira goes to the mill.", "Mira takes the lamp.", "Mira gives the lamp to Ode."),
     "Ode gives the lamp to Mira.", ["repeat_goal"]),
    (("Tam goes to the tower.", "Tam goes to the well."), "Tam goes to the tower.",
     ["repeat_goal"]),
    # repeat_goal only on an otherwise coherent step
    (("Mira goes to the mill.", "Mira takes the lamp.", "Mira drops the lamp.",
      "Mira goes to the well."), "Mira takes the lamp.", ["item_elsewhere"]),
    # several at once, in the checker's order
    (("Mira leaves the story.",), "Mira gives the key to Ode.", ["gone", "apart", "not_holding"]),
    (("Mira leaves the story.", "Ode leaves the story."), "Mira gives the lamp to Ode.",
     ["gone", "recipient_gone", "apart", "not_holding"]),
    (("Mira leaves the story.",), "Mira gives the lamp to Mira.",
     ["gone", "recipient_gone", "self", "not_holding"]),
    (("Mira leaves the story.",), "Mira goes to the well.", ["gone", "same_place"]),
    (("Mira leaves the story.",), "Mira takes the lamp.", ["gone", "item_elsewhere"]),
    (("Mira leaves the story.",), "Mira drops the key.", ["gone", "not_holding"]),
    # coherent steps
    ((), "Mira goes to the mill.", []),
    ((), "Mira meets Tam.", []),
    (("Mira goes to the mill.",), "Ode gives the key to Mira.", []),
    (("Mira goes to the mill.", "Mira takes the lamp.", "Mira drops the lamp."),
     "Ode takes the lamp.", []),  # someone else may take it
    (("Tam goes to the tower.",), "A storm floods the tower.", []),  # storms may hit people
]


@pytest.mark.parametrize("prelude, sentence, expected", CASES)
def test_contradictions_of_a_step(prelude, sentence, expected):
    state = played(*prelude)
    before = state.copy()
    step = None if sentence is None else parse_step(sentence)
    assert sentence is None or step is not None
    assert state.contradictions(step) == expected
    assert state == before  # checking never changes the state


def test_every_contradiction_but_missing_has_a_case():
    produced = {c for _, _, expected in CASES for c in expected}
    assert produced == set(CONTRADICTIONS) - {"missing"}


def test_incoherent_steps_leave_the_state_as_it_was():
    plot = "\n".join([
        "Tam gives the key to Mira.",  # not_holding: had it applied, Mira would hold the key
        "Mira drops the key.",  # so this is not_holding too
        "Mira takes the lamp.",  # item_elsewhere
        "Mira drops the lamp.",  # not_holding
        "A storm floods the tower.",
        "Mira goes to the tower.",  # flooded: Mira stays at the well
        "Mira goes to the well.",  # same_place
        "Mira leaves the story",  # malformed (no period): Mira is still there
        "Mira meets Tam.",
    ])
    check = check_plot(W, plot, 9)
    assert check.contradictions == [["not_holding"], ["not_holding"], ["item_elsewhere"],
                                    ["not_holding"], [], ["flooded"], ["same_place"],
                                    ["malformed"], []]
    assert check.kinds == [None, None, None, None, "storm", None, None, None, "meet"]


def test_leaving_drops_what_one_holds_where_one_is():
    state = played("Mira goes to the mill.", "Ode gives the key to Mira.", "Mira takes the lamp.",
                   "Mira goes to the tower.", "Mira leaves the story.")
    assert state.present == {"Ode", "Tam"}
    assert state.holder == {"lamp": None, "key": None}
    assert state.ground == {"lamp": "tower", "key": "tower"}
    assert state.done == {0}
    state = played("Ode leaves the story.", "Tam goes to the mill.", "Tam takes the key.")
    assert state.holder["key"] == "Tam" and state.ground["key"] is None


def test_apply_moves_items_and_finishes_goals():
    state = played("Mira goes to the mill.")
    assert state.location == {"Mira": "mill", "Ode": "mill", "Tam": "well"} and state.done == set()
    state = played("Mira goes to the mill.", "Ode drops the key.")
    assert state.holder["key"] is None and state.ground["key"] == "mill"
    state = played("Mira goes to the mill.", "Ode takes the lamp.", "Ode gives the lamp to Mira.")
    assert state.holder["lamp"] == "Mira" and state.ground["lamp"] is None and state.done == {0}
    state = played("Tam goes to the tower.")
    assert state.done == {1}


# ---------------------------------------------------------------- the bland storyteller

def test_storyteller_goes_toward_the_item_then_takes_it():
    assert W.initial_state().canonical_step() == Step("go", ("Mira", "mill"))
    assert played("Mira goes to the mill.").canonical_step() == Step("take", ("Mira", "lamp"))
    # goal 0 done: on to goal 1
    assert played("Mira goes to the mill.", "Mira takes the lamp.").canonical_step() == \
        Step("go", ("Tam", "tower"))


def test_storyteller_follows_the_holder_and_has_them_give_it():
    # Ode holds the lamp at the mill: Mira goes there, then Ode gives it
    state = played("Mira goes to the mill.", "Ode takes the lamp.", "Mira goes to the tower.")
    assert state.canonical_step() == Step("go", ("Mira", "mill"))
    state = played("Mira goes to the mill.", "Ode takes the lamp.")
    assert state.canonical_step() == Step("give", ("Ode", "lamp", "Mira"))
    # the holder moved: follow them
    state = played("Mira goes to the mill.", "Ode takes the lamp.", "Ode goes to the tower.")
    assert state.canonical_step() == Step("go", ("Mira", "tower"))


def test_storyteller_drains_a_flooded_destination():
    state = played("A storm floods the mill.")
    assert state.canonical_step() == Step("drain", ("mill",))
    state = played("Mira goes to the mill.", "Mira takes the lamp.", "A storm floods the tower.")
    assert state.canonical_step() == Step("drain", ("tower",))  # Tam's way to the tower


def test_storyteller_skips_goals_it_cannot_advance():
    # Mira holds the lamp from the start but her goal is not done: "Mira gives the lamp to Mira"
    # is incoherent, so the storyteller moves on to Tam's goal
    world = World(W.characters, W.places, W.items, W.start_location,
                  (("held", "Mira"), ("held", "Ode")), W.goals)
    assert world.initial_state().canonical_step() == Step("go", ("Tam", "tower"))
    # a goal whose character has left is skipped
    assert played("Mira leaves the story.").canonical_step() == Step("go", ("Tam", "tower"))


def test_storyteller_lets_people_leave_then_storms():
    state = played("Mira goes to the mill.", "Mira takes the lamp.", "Tam goes to the tower.")
    assert state.done == {0, 1}
    assert state.canonical_step() == Step("leave", ("Mira",))
    state = played("Tam goes to the tower.", "Mira leaves the story.")  # goal 0 can't advance
    assert state.canonical_step() == Step("leave", ("Ode",))
    state = played("Mira leaves the story.", "Ode leaves the story.", "Tam leaves the story.")
    assert state.canonical_step() == Step("storm", ("tower",))
    state = played("Mira leaves the story.", "Ode leaves the story.", "Tam leaves the story.",
                   "A storm floods the tower.", "A storm floods the well.")
    assert state.canonical_step() == Step("storm", ("mill",))
    state = played("Mira leaves the story.", "Ode leaves the story.", "Tam leaves the story.",
                   "A storm floods the tower.", "A storm floods the well.",
                   "A storm floods the mill.")
    assert state.canonical_step() == Step("drain", ("tower",))


def test_storyteller_step_is_always_coherent_and_among_the_coherent_steps():
    task = StoryTask(characters=4, places=4, items=3, goals=3)
    rng = np.random.default_rng(0)
    for ex in task.examples("train", 0, 40):
        state = task.world(ex).initial_state()
        for _ in range(12):
            step = state.canonical_step()
            options = state.coherent_steps()
            assert state.contradictions(step) == [] and step in options
            if rng.random() < 0.5:
                step = options[int(rng.integers(len(options)))]
            state.apply(step)


def test_coherent_steps_are_exactly_the_steps_without_contradictions():
    state = played("Mira goes to the mill.", "A storm floods the tower.")
    steps = state.coherent_steps()
    assert all(state.contradictions(s) == [] for s in steps)
    assert Step("take", ("Mira", "lamp")) in steps and Step("drain", ("tower",)) in steps
    assert Step("go", ("Tam", "tower")) not in steps and Step("storm", ("tower",)) not in steps
    assert Step("meet", ("Mira", "Ode")) in steps and Step("meet", ("Mira", "Tam")) not in steps
    # Mira: go well, take lamp, meet Ode, leave; Ode: go well, take lamp, drop key, give key to
    # Mira, meet Mira, leave; Tam: go mill, leave; storm mill, storm well, drain tower
    assert len(steps) == 4 + 6 + 2 + 3


# ---------------------------------------------------------------- checked plots and quality

PLOT = "\n".join([
    "Mira goes to the mill.",  # coherent, the storyteller's step
    "Mira takes the lamp.",  # coherent, the storyteller's step; goal 0 done
    "Ode meets Mira.",  # coherent; the storyteller would send Tam to the tower
    "Tam gives the key to Ode.",  # Tam is at the well without the key: apart, not_holding
])


def test_check_plot_by_hand():
    check = check_plot(W, PLOT, 4)
    assert check.steps == PLOT.split("\n")
    assert check.contradictions == [[], [], [], ["apart", "not_holding"]]
    assert check.predictable == [True, True, False, False]
    assert check.kinds == ["go", "take", "meet", None]
    assert check.progress == 0.5
    assert check.parts == pytest.approx(
        {"coherence": 3 / 4, "progress": 1 / 2, "variety": 3 / 4, "predictability": 2 / 4})
    # Q = 0.75 + 0.5 + 0.5 * 0.75 - 0.5 * 0.5
    assert check.quality == pytest.approx(1.375)
    assert step_contradictions(W, PLOT, 4) == [0, 0, 0, 2]


def test_lines_after_k_are_ignored():
    longer = PLOT + "\nTam goes to the tower.\nMira leaves the story."
    assert check_plot(W, longer, 4) == check_plot(W, PLOT, 4)
    # counted, the fifth line would finish Tam's goal
    assert check_plot(W, longer, 5).progress == 1.0


def test_missing_lines():
    plot = "Tam goes to the tower.\nMira meets Tam."  # the second: Tam is now at the tower
    check = check_plot(W, plot, 4)
    assert check.steps == ["Tam goes to the tower.", "Mira meets Tam.", "", ""]
    assert check.contradictions == [[], ["apart"], ["missing"], ["missing"]]
    assert check.kinds == ["go", None, None, None] and check.predictable == [False] * 4
    # Q = 1/4 + 1/2 + 0.5 * 1/4 - 0 = 0.875
    assert check.quality == pytest.approx(0.875)
    assert step_contradictions(W, plot, 4) == [0, 1, 1, 1]
    assert split_steps("a\nb", 3) == ["a", "b", ""] and split_steps("a\nb\nc", 2) == ["a", "b"]


@pytest.mark.parametrize("plot", ["", "\n\n", "Mira flies.", "\x00\n\n<tool>"])
def test_plots_with_no_coherent_step_score_zero(plot):
    check = check_plot(W, plot, 3)
    assert [len(c) for c in check.contradictions] == [1, 1, 1]
    assert check.quality == 0.0 and check.progress == 0.0


def test_the_canonical_plot_by_hand():
    # go mill, take lamp, Tam go tower, then everyone leaves in order: all predictable
    lines = ["Mira goes to the mill.", "Mira takes the lamp.", "Tam goes to the tower.",
             "Mira leaves the story.", "Ode leaves the story.", "Tam leaves the story.",
             "A storm floods the tower.", "A storm floods the mill."]
    check = check_plot(W, "\n".join(lines), 8)
    assert check.predictable == [True] * 8
    # variety: go, take, leave, storm = 4 kinds / 8; Q = 1 + 1 + 0.25 - 0.5
    assert check.quality == pytest.approx(1.75)
    ex = Example(prompt=W.opening(), answer="", meta=(W,))
    assert StoryTask(num_steps=8).canonical_plot(ex) == "\n".join(lines)
    # two more: the last place floods, then all are flooded and the first drains. K = 10 > 8:
    # variety is 5 kinds (drain added) / min(10, 8); Q = 1 + 1 + 0.5 * 5/8 - 0.5
    lines += ["A storm floods the well.", "The water drains from the tower."]
    assert StoryTask(num_steps=10).canonical_plot(ex) == "\n".join(lines)
    check = check_plot(W, "\n".join(lines), 10)
    assert check.parts["variety"] == 5 / 8 and check.quality == pytest.approx(1.8125)


def test_plot_stats_means():
    a = check_plot(W, PLOT, 4)  # Q 1.375, contradictions [0, 0, 0, 2]
    b = check_plot(W, "Tam goes to the tower.\nMira meets Tam.", 4)  # Q 0.875, [0, 1, 1, 1]
    stats = plot_stats([a, b])
    assert stats == pytest.approx({
        "quality": (1.375 + 0.875) / 2, "coherence": (3 / 4 + 1 / 4) / 2, "progress": 0.5,
        "variety": (3 / 4 + 1 / 4) / 2, "predictability": (2 / 4 + 0) / 2,
        "contradiction_rate": 4 / 8, "contradictions_per_step": 5 / 8})


# ---------------------------------------------------------------- the task

def test_examples_are_deterministic_and_splits_disjoint():
    task = make_task("story", seed=3)
    assert isinstance(task, StoryTask)
    assert task.example("train", 7) == StoryTask(seed=3).example("train", 7)
    assert task.example("test", 2) == StoryTask(seed=3).example("test", 2)
    assert task.example("train", 7) != StoryTask(seed=4).example("train", 7)
    train = [ex.prompt for ex in task.examples("train", 0, 100)]
    test = [ex.prompt for ex in task.examples("test", 0, 20)]
    assert len(set(train)) > 90 and not set(train) & set(test)


def test_generated_worlds_follow_the_config():
    task = StoryTask(characters=4, places=3, items=2, goals=3)
    for ex in task.examples("train", 0, 50):
        w = task.world(ex)
        assert ex.prompt == w.opening() and ex.prompt.endswith("\n")
        assert len(w.characters) == 4 and len(set(w.characters)) == 4
        assert len(w.places) == 3 and len(w.items) == 2 and len(w.goals) == 3
        assert [g.who for g in w.goals] == list(w.characters[:3])
        for g in w.goals:
            if g.kind == "reach":
                assert g.target in w.places
                assert g.target != w.start_location[w.characters.index(g.who)]
            else:
                assert g.target in w.items
                assert w.start_item[w.items.index(g.target)] != ("held", g.who)


def test_solutions_are_coherent_plots_of_k_lines():
    task = StoryTask()
    differ = 0
    for ex in task.examples("train", 0, 100):
        sol = task.solution(ex)
        assert sol == task.solution(ex) and len(sol.split("\n")) == task.num_steps
        check = task.check(sol, ex)
        assert check.contradictions == [[]] * task.num_steps
        canon = task.canonical_plot(ex)
        assert task.check(canon, ex).parts["predictability"] == 1.0
        assert task.check(canon, ex).parts["coherence"] == 1.0
        differ += sol != canon
    assert 0 < differ < 100  # novelty 0.3 over 6 steps: most plots leave the script somewhere


def test_novelty_zero_gives_the_canonical_plot():
    task = StoryTask(novelty=0.0, num_steps=7)
    for ex in task.examples("train", 0, 30):
        assert task.solution(ex) == task.canonical_plot(ex)


def test_score_is_scaled_quality_and_never_raises():
    ex = Example(prompt=W.opening(), answer="", meta=(W,))
    task = StoryTask(num_steps=4)
    assert task.score(PLOT, ex) == pytest.approx((1.375 + 0.5) / 3)
    for garbage in ("\x00\n\n<tool>", "x" * 10_000, "\n" * 10_000, "Mira goes to the mill." * 500,
                    "Mira goes to the mill.\n" * 2000):
        assert 0.0 <= task.score(garbage, ex) <= 1.0
    assert task.score("\x00\n\n<tool>", ex) == pytest.approx(0.5 / 3)
    assert task.score("x" * 10_000, ex) == pytest.approx(0.5 / 3)
    # the first line is coherent and the storyteller's, the rest repeat it: same_place
    # Q = 1/4 + 0 + 0.5 * 1/4 - 0.5 * 1/4 = 0.25
    assert task.score("Mira goes to the mill.\n" * 2000, ex) == pytest.approx(0.75 / 3)


@pytest.mark.parametrize("kwargs", [
    {"goals": 5}, {"goals": 0}, {"novelty": 1.5}, {"novelty": -0.1}, {"places": 1},
    {"places": 9}, {"characters": 0}, {"characters": 9}, {"items": 0}, {"items": 9},
    {"num_steps": 0}, {"characters": 2, "goals": 3},
])
def test_config_validation(kwargs):
    with pytest.raises(ValueError):
        StoryTask(**kwargs)


@pytest.mark.parametrize("kwargs", [
    dict(characters=8, places=8, items=8, goals=8, novelty=1.0, num_steps=1),
    dict(characters=1, places=2, items=1, goals=1, novelty=0.0),
])
def test_config_edges_are_accepted_and_build_worlds_of_that_size(kwargs):
    """The largest and smallest accepted configs build worlds of exactly those sizes, one goal
    for each of the first `goals` characters, and coherent solutions of num_steps lines; at
    novelty 0 the solution is the canonical plot, at novelty 1 a plot of only random coherent
    steps leaves it somewhere."""
    task = StoryTask(**kwargs)
    assert [getattr(task, k) for k in kwargs] == list(kwargs.values())
    differ = 0
    for ex in task.examples("train", 0, 20):
        w = task.world(ex)
        assert (len(set(w.characters)), len(set(w.places)), len(set(w.items)), len(w.goals)) == (
            task.characters, task.places, task.items, task.goals)
        assert [g.who for g in w.goals] == list(w.characters[: task.goals])
        sol = task.solution(ex)
        assert len(sol.split("\n")) == task.num_steps
        assert task.check(sol, ex).contradictions == [[]] * task.num_steps
        differ += sol != task.canonical_plot(ex)
    if task.novelty == 0.0:
        assert differ == 0
    else:
        assert differ > 0, "novelty 1: every plot was the canonical one"
