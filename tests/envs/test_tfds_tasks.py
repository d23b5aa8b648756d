"""Dataset-backed text tasks (envs/text/tfds_tasks.py): the answer checks, each TFDS adapter on
controlled records under `tfds.testing.mock_data` (data_source and the tfds.load fallback), a real
prepared GSM8K in both file formats, the JSONL task, and the one-line errors."""

from __future__ import annotations

import contextlib
import json
import sys
from decimal import Decimal
from unittest import mock

import numpy as np
import pytest

tfds = pytest.importorskip("tensorflow_datasets")

from jaxrl_suite.envs.text import TASKS, make_task  # noqa: E402
from jaxrl_suite.envs.text.tfds_tasks import (  # noqa: E402
    CLASSIFY_TEMPLATE,
    GSM8K_TEMPLATE,
    QA_TEMPLATE,
    Gsm8kTask,
    JsonlTask,
    clear_dataset_cache,
    exact_match,
    gsm8k_final_answer,
    normalize_answer,
    parse_number,
    token_f1,
)

AG_NEWS = ("World", "Sports", "Business", "Sci/Tech")


@pytest.fixture(autouse=True)
def _fresh_cache():
    clear_dataset_cache()
    yield
    clear_dataset_cache()


@contextlib.contextmanager
def mock_splits(splits: dict[str, list[dict]], calls: list | None = None):
    """`tfds.data_source` returns exactly `splits[tfds_split]` (records as TFDS gives them)."""

    def as_data_source(builder, split, **kwargs):
        if calls is not None:
            calls.append((builder.name, split))
        if split not in splits:
            raise ValueError(f"Unknown split '{split}'. Should be one of {sorted(splits)}.")
        return list(splits[split])

    with tfds.testing.mock_data(policy=tfds.testing.MockPolicy.USE_CODE,
                                as_data_source_fn=as_data_source):
        yield


def _all(task, split):
    return [task.example(split, i) for i in range(task.size(split))]


def _by_answer(task, split):
    return {ex.answer: ex for ex in _all(task, split)}


def _gsm(question: str, steps: str, final: str) -> dict:
    return {"question": question.encode(), "answer": f"{steps}\n#### {final}".encode(),
            "annotation": b"", "short_answer": final.encode()}


GSM_TRAIN = [_gsm(f"Tom has {i} apples. How many?", f"He has <<{i}*1={i}>>{i}.", f"{i},000")
             for i in range(1, 21)]
GSM_TEST = [_gsm(f"Ann has {i} pears?", f"Ann: {i}", str(i)) for i in range(100, 104)]


# ----------------------------------------------------------------------------- answer checks


def test_parse_number():
    assert parse_number("1,234") == Decimal(1234)
    assert parse_number(" $1,234.50 ") == Decimal("1234.5")
    assert parse_number("72.0") == parse_number("72") == Decimal(72)
    assert parse_number("-7.") == Decimal(-7)
    assert parse_number("-$5") == Decimal(-5)
    assert parse_number(".5") == Decimal("0.5")
    for bad in ["", "72%", "1,2", "12,34", "72 apples", "1e3", "7/2", "NaN", "inf", "$", "--1",
                "1 234", "1" * 65]:
        assert parse_number(bad) is None, bad


def test_gsm8k_final_answer():
    assert gsm8k_final_answer("He pays 2*617=1234.\n#### 1,234") == "1234"
    assert gsm8k_final_answer("a #### b\n#### -3") == "-3"  # the last "####" counts
    with pytest.raises(ValueError, match="####"):
        gsm8k_final_answer("The answer is 5.")
    with pytest.raises(ValueError, match="####"):
        gsm8k_final_answer("#### five")


def test_normalize_exact_match_and_token_f1():
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert normalize_answer("A cat, an apple & the dog.") == "cat apple dog"
    assert normalize_answer("Theatre") == "theatre"  # articles only as whole words
    assert exact_match("the Eiffel Tower.", "eiffel tower") == 1.0
    assert exact_match("Eiffel", "Eiffel Tower") == 0.0
    # "red barn" vs "the red barn door in Ohio": 2 shared tokens, P = 2/2, R = 2/5.
    assert token_f1("red barn", "the red barn door in Ohio") == pytest.approx(2 * 0.4 / 1.4)
    # Multiset overlap: "barn barn" shares one "barn" with "red barn": P = 1/2, R = 1/2.
    assert token_f1("barn barn", "red barn") == pytest.approx(0.5)
    assert token_f1("Ohio", "Paris") == 0.0
    assert token_f1("barn red", "red barn") == 1.0  # F1 ignores order; EM does not
    assert exact_match("barn red", "red barn") == 0.0
    assert token_f1("the", "a") == 1.0 and token_f1("the", "barn") == 0.0  # empty after norm


# ----------------------------------------------------------------------------- GSM8K


def test_gsm8k_prompt_answer_and_reward():
    task = make_task("gsm8k")
    with mock_splits({"train": GSM_TRAIN, "test": GSM_TEST}):
        examples = _by_answer(task, "train")
    ex = examples["7000"]
    assert ex.prompt == GSM8K_TEMPLATE.format(question="Tom has 7 apples. How many?")
    assert ex.prompt.startswith("Question: Tom has 7 apples. How many?\n")
    assert ex.meta == ("He has 7.",)  # calculator annotation removed
    for good in ["<answer>7000</answer>", "<answer>7,000</answer>", "<answer> $7,000.00 </answer>",
                 "<answer>7000.</answer>", "working... <answer>7000</answer> done"]:
        assert task.score(good, ex) == 1.0, good
    for bad in ["<answer>7001</answer>", "7000", "<answer>7000", "<answer>about 7000</answer>",
                "<answer>7,0000</answer>", "<answer></answer>", "<answer>6999</answer><answer>7000"
                "</answer>", ""]:
        assert task.score(bad, ex) == 0.0, bad
    assert task.solution(ex) == "<answer>7000</answer>" and task.score(task.solution(ex), ex) == 1
    assert task.reward("<answer>7000</answer>", ex, format_weight=0.5) == 1.5
    assert task.feedback("no tags", ex) == "no answer"
    assert task.feedback("<answer>seven</answer>", ex) == "not a number"
    assert task.feedback("<answer>1</answer>", ex) == "wrong"
    assert task.feedback("<answer>7000</answer>", ex) == "correct"


def test_gsm8k_rationale_solution():
    task = make_task("gsm8k", rationale=True)
    with mock_splits({"train": GSM_TRAIN, "test": GSM_TEST}):
        ex = _by_answer(task, "test")["102"]
    assert task.solution(ex) == "Ann: 102\n<answer>102</answer>"
    assert task.score(task.solution(ex), ex) == 1.0


def test_order_is_a_seeded_permutation_that_wraps_around():
    splits = {"train": GSM_TRAIN, "test": GSM_TEST}
    with mock_splits(splits):
        a = _all(Gsm8kTask(seed=0), "train")
        assert Gsm8kTask(seed=0).size("train") == 20 and Gsm8kTask().size("test") == 4
        clear_dataset_cache()
        again = _all(Gsm8kTask(seed=0), "train")
        other = _all(Gsm8kTask(seed=1), "train")
        task = Gsm8kTask(seed=0)
        wrapped = task.examples("train", 18, 4)
        far = task.example("train", 20 * 1000 + 5)
        fixed = _all(Gsm8kTask(seed=3, shuffle_test=False), "test")
        shuffled_test = [Gsm8kTask(seed=s).example("test", 0).answer for s in range(8)]
        sample = task._generate(np.random.default_rng(0))
    answers = [ex.answer for ex in a]
    assert sorted(answers, key=int) == [f"{i}000" for i in range(1, 21)]  # each record once
    assert answers != [f"{i}000" for i in range(1, 21)]  # shuffled
    assert again == a  # same seed: same order, after reloading
    assert [ex.answer for ex in other] != answers and sorted(ex.answer for ex in other) == sorted(
        answers)
    assert wrapped == [a[18], a[19], a[0], a[1]]
    assert far == a[5]
    assert [ex.answer for ex in fixed] == ["100", "101", "102", "103"]  # dataset order
    assert len(set(shuffled_test)) > 1  # the test split is shuffled by seed by default
    assert sample in a
    with pytest.raises(ValueError, match="index"):
        task.example("train", -1)
    with pytest.raises(ValueError, match="split"):
        task.example("validation", 0)


def test_splits_are_the_datasets_and_disjoint():
    calls = []
    with mock_splits({"train": GSM_TRAIN, "test": GSM_TEST}, calls):
        task = make_task("gsm8k")
        train, test = _all(task, "train"), _all(task, "test")
        _all(task, "train")
    assert {ex.answer for ex in test} == {"100", "101", "102", "103"}
    assert not {ex.prompt for ex in train} & {ex.prompt for ex in test}
    assert sorted(calls) == [("gsm8k", "test"), ("gsm8k", "train")]  # each split loaded once


def test_malformed_record_names_dataset_split_and_record():
    bad = [{"question": b"q", "answer": b"no final line", "annotation": b"", "short_answer": b""}]
    with mock_splits({"train": bad}), pytest.raises(ValueError) as info:
        make_task("gsm8k").example("train", 0)
    msg = str(info.value)
    assert "\n" not in msg and "'gsm8k'" in msg and "'train'" in msg and "record 0" in msg
    with mock_splits({"train": [{"question": b"q"}]}), pytest.raises(ValueError) as info:
        make_task("gsm8k").example("train", 0)
    assert "answer" in str(info.value) and "gsm8k" in str(info.value)


def test_gsm8k_tfds_load_fallback_equals_data_source():
    """Data prepared as tfrecord: data_source raises NotImplementedError -> tfds.load path."""
    tf = pytest.importorskip("tensorflow")
    with mock_splits({"train": GSM_TRAIN, "test": GSM_TEST}):
        via_source = _all(make_task("gsm8k", seed=4), "train")
    clear_dataset_cache()

    def no_source(builder, split, **kwargs):
        raise NotImplementedError("Random access data source for file format tfrecord")

    def as_dataset(builder, split, *args, **kwargs):
        rows = {"train": GSM_TRAIN, "test": GSM_TEST}[str(split)]
        return tf.data.Dataset.from_tensor_slices({k: [r[k] for r in rows] for k in rows[0]})

    with tfds.testing.mock_data(policy=tfds.testing.MockPolicy.USE_CODE,
                                as_data_source_fn=no_source, as_dataset_fn=as_dataset):
        via_load = _all(make_task("gsm8k", seed=4), "train")
    assert via_load == via_source


# ----------------------------------------------------------------------------- classification


AG_TRAIN = [{"title": f"Title {i}".encode(), "description": f"Desc {i}.".encode(), "label": i % 4}
            for i in range(8)]


def test_ag_news_prompt_answer_and_reward():
    task = make_task("ag_news")
    with mock_splits({"train": AG_TRAIN, "test": AG_TRAIN[:2]}):
        examples = {ex.prompt: ex for ex in _all(task, "train")}
        assert task.labels() == AG_NEWS
    prompt = CLASSIFY_TEMPLATE.format(text="Title 3\nDesc 3.", labels=", ".join(AG_NEWS))
    assert prompt == ("Text: Title 3\nDesc 3.\nLabels: World, Sports, Business, Sci/Tech\n"
                      "Answer with one label inside <answer></answer>.\n")
    ex = examples[prompt]
    assert ex.answer == "Sci/Tech" and ex.meta == (3, AG_NEWS)
    assert [examples[p].answer for p in examples].count("Sports") == 2
    for good in ["<answer>Sci/Tech</answer>", "<answer> sci/tech </answer>", "<answer>SCI/TECH"
                 "</answer>"]:
        assert task.score(good, ex) == 1.0
    for bad in ["<answer>Sports</answer>", "<answer>Sci</answer>", "<answer>Sci/Tech news"
                "</answer>", "Sci/Tech", ""]:
        assert task.score(bad, ex) == 0.0
    assert task.score(task.solution(ex), ex) == 1.0


def test_imdb_label_names_and_truncation():
    rows = [{"text": b"A long, long review " * 10, "label": 0}, {"text": b"Great!", "label": 1}]
    task = make_task("imdb", label_names=["negative", "positive"], max_text_chars=12)
    assert task.label_names == ("negative", "positive") and hash(task)  # list -> tuple
    with mock_splits({"train": rows, "test": rows}):
        ex = {e.answer: e for e in _all(task, "test")}
        plain = {e.answer: e for e in _all(make_task("imdb"), "test")}
        with pytest.raises(ValueError, match="3 names but .* 2 classes"):
            make_task("imdb", label_names=("a", "b", "c")).example("train", 0)
    assert ex["negative"].prompt == ("Text: A long, long\nLabels: negative, positive\n"
                                     "Answer with one label inside <answer></answer>.\n")
    assert task.score("<answer>Positive</answer>", ex["positive"]) == 1.0
    assert task.score("<answer>pos</answer>", ex["positive"]) == 0.0
    assert plain["pos"].prompt.startswith("Text: Great!\nLabels: neg, pos\n")
    with pytest.raises(ValueError, match="distinct"):
        make_task("imdb", label_names=("pos", "POS"))
    with pytest.raises(ValueError, match="placeholder"):
        make_task("imdb", template="{review}")
    with pytest.raises(ValueError, match="max_text_chars"):
        make_task("imdb", max_text_chars=0)


# ----------------------------------------------------------------------------- QA


def _trivia(question, value, aliases, normalized):
    return {"question": question.encode(), "question_id": b"id",
            "answer": {"value": value.encode(), "aliases": [a.encode() for a in aliases],
                       "normalized_aliases": [a.encode() for a in normalized],
                       "normalized_value": value.lower().encode(), "type": b"WikipediaEntity",
                       "matched_wiki_entity_name": b"", "normalized_matched_wiki_entity_name": b""}}


TRIVIA = [_trivia("Where is the Eiffel Tower?", "Paris", ["Paris", "Paris, France"],
                  ["paris", "paris france"]),
          _trivia("Which barn?", "The red barn door in Ohio", [], [])]


def test_trivia_qa_em_and_f1():
    calls = []
    with mock_splits({"train": TRIVIA[:1], "validation": TRIVIA}, calls):
        f1 = make_task("trivia_qa")
        em = make_task("trivia_qa", metric="em")
        paris = _all(f1, "train")[0]
        barn = {e.answer: e for e in _all(em, "test")}["The red barn door in Ohio"]
    assert ("trivia_qa", "validation") in calls and ("trivia_qa", "train") in calls
    assert paris.prompt == QA_TEMPLATE.format(question="Where is the Eiffel Tower?")
    assert paris.answer == "Paris"
    assert paris.meta == ("Paris", "Paris, France", "paris", "paris france")  # deduplicated
    assert f1.solution(paris) == "<answer>Paris</answer>" and f1.score(f1.solution(paris), paris)
    assert f1.score("<answer>paris, france.</answer>", paris) == 1.0  # an alias, normalised
    assert em.score("<answer>the PARIS!</answer>", paris) == 1.0
    # F1: best alias; "Paris Texas" vs "paris": P 1/2, R 1 -> 2/3; vs "paris france": 1/2.
    assert f1.score("<answer>Paris Texas</answer>", paris) == pytest.approx(2 / 3)
    assert em.score("<answer>Paris Texas</answer>", paris) == 0.0
    assert f1.score("<answer>red barn</answer>", barn) == pytest.approx(2 * 0.4 / 1.4)
    assert em.score("<answer>red barn</answer>", barn) == 0.0
    assert em.score("<answer>red barn door in ohio</answer>", barn) == 1.0  # article dropped
    for task in (em, f1):
        assert task.score("Paris", paris) == 0.0  # no tags
        assert task.score("<answer>London</answer>", paris) == 0.0
    assert f1.feedback("<answer>Paris Texas</answer>", paris) == "partly right (F1 0.67)"
    assert f1.feedback("<answer>London</answer>", paris) == "wrong"
    with pytest.raises(ValueError, match="metric"):
        make_task("trivia_qa", metric="bleu")


def test_nq_open_aliases():
    rows = [{"question": b"who wrote hamlet", "answer": [b"William Shakespeare", b"Shakespeare"]}]
    with mock_splits({"train": rows, "validation": rows}):
        task = make_task("nq_open", metric="em")
        ex = task.example("test", 0)
        assert task.size("test") == 1
    assert ex.prompt == "Question: who wrote hamlet\nAnswer inside <answer></answer>.\n"
    assert ex.answer == "William Shakespeare" and ex.meta == ("William Shakespeare", "Shakespeare")
    assert task.score("<answer>shakespeare</answer>", ex) == 1.0
    assert task.score("<answer>Marlowe</answer>", ex) == 0.0
    assert task.score(task.solution(ex), ex) == 1.0


def test_random_mock_data_works_for_every_tfds_adapter():
    """TFDS's own random mock records (str, arrays, nested features) convert without errors."""
    with tfds.testing.mock_data(num_examples=3):
        for name in ("ag_news", "imdb", "trivia_qa", "nq_open"):
            task = make_task(name)
            for split in ("train", "test"):
                ex = task.example(split, 2)
                assert isinstance(ex.prompt, str) and ex.answer and hash(ex)
                assert task.score(task.solution(ex), ex) == 1.0


# ----------------------------------------------------------------------------- real files


@pytest.fixture(scope="module")
def prepared_gsm8k(tmp_path_factory):
    """A real gsm8k prepared as array_record and as tfrecord from local files (no network)."""
    pytest.importorskip("tensorflow")

    src = tmp_path_factory.mktemp("gsm8k_src")
    names = {"train": GSM_TRAIN[:3], "test": GSM_TEST[:2], "train_socratic": GSM_TRAIN[:1],
             "test_socratic": GSM_TEST[:1]}  # TFDS refuses to write an empty split
    for split, rows in names.items():
        lines = [json.dumps({"question": r["question"].decode(), "answer": r["answer"].decode()})
                 for r in rows]
        (src / f"{split}.jsonl").write_text("".join(line + "\n" for line in lines))
    dirs = {}
    with mock.patch.object(tfds.download.DownloadManager, "download_and_extract",
                           lambda self, urls: {k: str(src / f"{k}.jsonl") for k in urls}):
        for fmt in ("array_record", "tfrecord"):
            dirs[fmt] = str(tmp_path_factory.mktemp(f"tfds_{fmt}"))
            tfds.builder("gsm8k", data_dir=dirs[fmt]).download_and_prepare(
                file_format=fmt, download_config=tfds.download.DownloadConfig(
                    compute_stats=tfds.download.ComputeStatsMode.SKIP))
    return dirs


def test_real_prepared_gsm8k_both_formats(prepared_gsm8k):
    out = {}
    for fmt, data_dir in prepared_gsm8k.items():
        task = make_task("gsm8k", data_dir=data_dir, seed=2)
        out[fmt] = (_all(task, "train"), _all(task, "test"))
    assert out["array_record"] == out["tfrecord"]
    train, test = out["array_record"]
    assert sorted(ex.answer for ex in train) == ["1000", "2000", "3000"]
    assert sorted(ex.answer for ex in test) == ["100", "101"]
    ex = {e.answer: e for e in train}["2000"]
    assert ex.prompt == GSM8K_TEMPLATE.format(question="Tom has 2 apples. How many?")
    assert Gsm8kTask(data_dir=prepared_gsm8k["array_record"]).score("<answer>2,000</answer>",
                                                                    ex) == 1.0


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize("name, dataset", [("gsm8k", "gsm8k"),
                                           ("trivia_qa", "trivia_qa/rc.nocontext"),
                                           ("ag_news", "ag_news_subset")])
def test_unprepared_dataset_is_one_line_error(tmp_path, no_network, name, dataset):
    task = make_task(name, data_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError) as info:
        task.example("train", 0)
    msg = str(info.value)
    assert "\n" not in msg and f"'{dataset}'" in msg and str(tmp_path) in msg
    assert "download_and_prepare" in msg and "network" in msg
    assert not list(tmp_path.iterdir())  # nothing was downloaded or written


def test_unknown_config_is_one_line_error(tmp_path, no_network):
    with pytest.raises(ValueError) as info:
        make_task("trivia_qa", config="nonsense", data_dir=str(tmp_path)).size("train")
    msg = str(info.value)
    assert "\n" not in msg and "trivia_qa/nonsense" in msg


def test_missing_tensorflow_datasets_is_import_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
    with pytest.raises(ImportError, match=r'pip install -e "\.\[tfds\]"'):
        make_task("gsm8k").example("train", 0)


# ----------------------------------------------------------------------------- JSONL


def _write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def test_jsonl_task_with_test_file(tmp_path):
    train = _write_jsonl(tmp_path / "train.jsonl", [
        {"prompt": "2+2=", "answer": 4}, "", {"prompt": "Capital of France?", "answer": "Paris"},
        {"prompt": "Big number?", "answer": "1,234"}, {"prompt": "Pets?", "answer": ["cat", "dog"]},
    ])
    test = _write_jsonl(tmp_path / "test.jsonl", [{"prompt": "3+3=", "answer": "6"}])
    task = make_task("jsonl", path=train, test_path=test)
    assert task.size("train") == 4 and task.size("test") == 1  # the blank line is skipped
    ex = {e.prompt: e for e in _all(task, "train")}
    assert task.example("test", 0).prompt == "3+3=" and task.example("test", 7).answer == "6"
    four, paris, big, pets = ex["2+2="], ex["Capital of France?"], ex["Big number?"], ex["Pets?"]
    assert four.answer == "4" and pets.meta == ("cat", "dog") and pets.answer == "cat"
    # Numeric answers compare by value.
    assert task.score("<answer>4.0</answer>", four) == 1.0
    assert task.score("<answer>1234</answer>", big) == 1.0
    assert task.score("<answer>$1,234.00</answer>", big) == 1.0
    assert task.score("<answer>four</answer>", four) == 0.0
    assert task.score("<answer>5</answer>", four) == 0.0
    # Text answers: case-folded, whitespace collapsed, nothing else.
    assert task.score("<answer>  PARIS </answer>", paris) == 1.0
    assert task.score("<answer>Paris.</answer>", paris) == 0.0
    assert task.score("<answer>Dog</answer>", pets) == 1.0
    assert task.score("Paris", paris) == 0.0
    for e in ex.values():
        assert task.score(task.solution(e), e) == 1.0


def test_jsonl_hash_split_is_disjoint_and_stable(tmp_path):
    rows = [{"prompt": f"q{i}", "answer": str(i)} for i in range(200)]
    rows += [{"prompt": "q7", "answer": "seven"}]  # a duplicate prompt shares its split
    path = _write_jsonl(tmp_path / "all.jsonl", rows)
    task = JsonlTask(path=path, test_fraction=0.25)
    train, test = _all(task, "train"), _all(task, "test")
    assert len(train) + len(test) == 201 and 30 <= len(test) <= 70
    train_prompts, test_prompts = {e.prompt for e in train}, {e.prompt for e in test}
    assert not train_prompts & test_prompts
    assert [e.prompt for e in train + test].count("q7") == 2
    # Stable: another process/instance splits the same way; a new seed only reorders.
    clear_dataset_cache()
    other = JsonlTask(path=path, test_fraction=0.25, seed=9)
    assert {e.prompt for e in _all(other, "test")} == test_prompts
    assert [e.prompt for e in _all(other, "test")] != [e.prompt for e in test]
    assert JsonlTask(path=path, test_fraction=0.0).size("test") == 0
    with pytest.raises(ValueError, match="split 'test' is empty"):
        JsonlTask(path=path, test_fraction=0.0).example("test", 0)


def test_jsonl_reloads_a_changed_file(tmp_path):
    path = tmp_path / "t.jsonl"
    _write_jsonl(path, [{"prompt": "a", "answer": "1"}])
    task = JsonlTask(path=str(path), test_fraction=0.0)
    assert task.example("train", 0).answer == "1"
    _write_jsonl(path, [{"prompt": "a", "answer": "22"}, {"prompt": "b", "answer": "3"}])
    assert task.size("train") == 2


@pytest.mark.parametrize("lines, match", [
    (['{"prompt": "a", "answer": "1"}', '{"prompt": "b", "answer": "2"}', '{"prompt": "c"'],
     r":3: invalid JSON"),
    (['{"prompt": "a", "answer": "1"}', '{"prompt": "b"}'], r":2: missing field 'answer'"),
    (['{"question": "a", "answer": "1"}'], r":1: missing field 'prompt'"),
    (['["a", "1"]'], r":1: expected a JSON object"),
    (['{"prompt": "a", "answer": true}'], r":1: field 'answer' must be a string, a number"),
    (['{"prompt": "a", "answer": {"x": 1}}'], r":1: field 'answer' must be"),
    (['{"prompt": "a", "answer": []}'], r":1: field 'answer' must be non-empty"),
    (['{"prompt": "", "answer": "1"}'], r":1: field 'prompt' must be a non-empty string"),
    (["", "  "], r"has no records"),
])
def test_jsonl_bad_file_is_one_line_error(tmp_path, lines, match):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=match) as info:
        JsonlTask(path=str(path)).size("train")
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_jsonl_config_errors(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        JsonlTask(path=str(tmp_path / "missing.jsonl")).example("train", 0)
    assert "\n" not in str(info.value) and "missing.jsonl" in str(info.value)
    with pytest.raises(ValueError, match="path="):
        make_task("jsonl")
    with pytest.raises(ValueError, match="test_fraction"):
        JsonlTask(path="x.jsonl", test_fraction=1.0)


def test_registered_and_hashable(tmp_path):
    assert {"gsm8k", "ag_news", "imdb", "trivia_qa", "nq_open", "jsonl"} <= set(TASKS.names())
    assert make_task("gsm8k", data_dir="/d", seed=1) == Gsm8kTask(data_dir="/d", seed=1)
    assert len({make_task("gsm8k"), make_task("gsm8k"), make_task("gsm8k", seed=1)}) == 2
    with pytest.raises(TypeError):
        make_task("gsm8k", digits=3)  # not a field of this task
