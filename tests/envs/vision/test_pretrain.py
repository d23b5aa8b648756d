"""The base VLM's pretraining corpus (envs/vision/pretrain.py): determinism, the mix, captions
that state their scene (and fix what they correct), tagged documents from other domains only,
no held-out scene."""

import re

import numpy as np
import pytest

from jaxrl_suite.envs.text.base import stable_hash
from jaxrl_suite.envs.vision import (
    IMAGE_MARKER,
    OBJECT_COLOURS,
    SHAPES,
    TAGGED_DOMAINS,
    PretrainCorpus,
    grounded_facts,
    scene_key,
    self_corrections,
)
from jaxrl_suite.rewards import think_answer_format

N = 600
SPATIAL_WORDS = ("left", "right", "above", "below", "closer", "nearer", "front", "cover",
                 "Options", "image", "object", *OBJECT_COLOURS, *SHAPES)


@pytest.fixture(scope="module")
def docs():
    corpus = PretrainCorpus(correction_share=0.2)
    return corpus, corpus.documents(0, N)


def test_deterministic_by_seed_and_index(docs):
    corpus, got = docs
    assert PretrainCorpus(correction_share=0.2).documents(0, 30) == got[:30]
    assert corpus.document(17) == got[17]
    other = PretrainCorpus(correction_share=0.2, seed=1).documents(0, 30)
    assert sum(a.text == b.text for a, b in zip(got, other, strict=False)) < 5


def test_the_mix(docs):
    _, got = docs
    captions = [d for d in got if d.kind == "caption"]
    assert abs(len(captions) / N - 0.5) < 0.07
    share = sum(d.corrected for d in captions) / len(captions)
    assert abs(share - 0.2) < 0.07
    assert not any(d.corrected for d in got if d.kind == "tagged")
    none = PretrainCorpus(correction_share=0.0).documents(0, 100)
    assert not any(d.corrected for d in none)


def test_captions_state_their_scene(docs):
    corpus, got = docs
    for d in (d for d in got if d.kind == "caption"):
        (scene,) = d.scenes
        assert d.text.startswith(IMAGE_MARKER) and d.text.count(IMAGE_MARKER) == 1
        n = len(scene.objects)
        assert d.text[len(IMAGE_MARKER):].startswith(f"{n} object")
        for o in scene.objects:  # every object, at its cell (the last mention, if corrected)
            cells = re.findall(rf"a {o.colour} {o.shape} at \((\d),(\d)\)(?:, wait, no: at "
                               rf"\((\d),(\d)\))?", d.text)
            (cell,) = cells
            assert (int(cell[-2] or cell[0]), int(cell[-1] or cell[1])) == (o.x, o.y)
        facts = grounded_facts(d.text, scene)
        fixes = self_corrections(d.text, scene)
        assert len(fixes) == d.corrected
        if d.corrected:  # one wrong fact, then its fix
            assert fixes[0].fixes and [f.holds for f in facts].count(False) == 1
        else:
            assert all(f.holds for f in facts)
        images = corpus.images(d)
        assert images.shape == (1, 32, 32, 3) and images.dtype == np.uint8


def test_no_caption_shows_a_held_out_scene(docs):
    _, got = docs
    assert all(stable_hash(scene_key(d.scenes[0])) % 10 for d in got if d.kind == "caption")


def test_tagged_documents_are_other_domains_in_the_tag_format(docs):
    corpus, got = docs
    tagged = [d for d in got if d.kind == "tagged"]
    domains = set()
    for d in tagged:
        assert d.scenes == () and corpus.images(d).shape == (0, 32, 32, 3)
        prompt, completion = d.text.split("Assistant: <think>")
        assert prompt.startswith("User: ") and think_answer_format(completion) == 1.0
        assert not any(w in d.text for w in SPATIAL_WORDS), d.text
        question = prompt[len("User: "):]
        answer = int(re.search(r"<answer>(\d+)</answer>", d.text).group(1))
        nums = [int(v) for v in re.findall(r"\d+", question)]
        if "gets" in question:
            domains.add("arithmetic")
            assert answer == nums[0] + nums[1]
        elif "gives away" in question:
            domains.add("arithmetic")
            assert answer == nums[0] - nums[1] >= 1
        elif "appear in" in question:
            domains.add("count_list")
            target, words = re.fullmatch(r"How many times does (\w+) appear in: (.*)\?\n",
                                         question).groups()
            assert answer == words.split().count(target)
        else:
            domains.add("compare")
            assert answer == (max(nums) if "larger" in question else min(nums))
    assert domains == set(TAGGED_DOMAINS)


def test_bad_options_raise():
    with pytest.raises(ValueError, match="correction_share must be in"):
        PretrainCorpus(correction_share=1.5)
    with pytest.raises(ValueError, match="objects must satisfy"):
        PretrainCorpus(objects=(0, 3))
    with pytest.raises(ValueError, match="index must be >= 0"):
        PretrainCorpus().document(-1)


def test_pretrain_task_cuts_each_document_into_prompt_and_continuation():
    from jaxrl_suite.envs.vision import PretrainTask

    task = PretrainTask(max_chars=120)
    corpus = task.corpus
    for i, ex in enumerate(task.examples("train", 0, 200)):
        assert len(task.solution(ex)) <= 120
        assert task.score(task.solution(ex), ex) == 1.0 and task.score("x", ex) == 0.0
        if ex.meta.kind == "caption":
            assert ex.prompt == IMAGE_MARKER and len(ex.meta.scenes) == 1
        else:
            assert ex.prompt.startswith("User: ") and ex.prompt.endswith("Assistant: <think>")
        doc = corpus.document(i)
        rest = doc.text.split("<think>", 1)[1] if doc.kind == "tagged" else \
            doc.text[len(IMAGE_MARKER):]
        if len(rest) <= 120:  # short enough: document i itself
            assert ex.prompt + ex.answer == doc.text
    test = task.example("test", 0)
    assert test.prompt + test.answer in {corpus.document(10**12 + k * 10**9).text
                                         for k in range(20)}  # the test split's own documents
    with pytest.raises(ValueError, match="max_chars"):
        PretrainTask(max_chars=10)
    with pytest.raises(ValueError, match="correction_share"):
        PretrainTask(correction_share=2.0)


# ---- attribute questions in the think frame (question_share) ----
NQ = 4000
CATEGORY_WORDS = ("how many", "count", "number", "left", "right", "above", "below", "closer",
                  "nearer", "near", "front", "camera", "viewer", "cover", "distance")
FRAME = "\nAssistant: <think>"


@pytest.fixture(scope="module")
def asked():
    corpus = PretrainCorpus(question_share=0.5)
    return corpus, corpus.documents(0, NQ)


def test_question_shares(asked):
    _, got = asked
    share = {k: sum(d.kind == k for d in got) / NQ for k in ("caption", "question", "tagged")}
    assert abs(share["question"] - 0.25) < 0.03 and abs(share["caption"] - 0.25) < 0.03
    assert abs(share["tagged"] - 0.5) < 0.03
    assert not any(d.corrected for d in got if d.kind == "question")
    only = PretrainCorpus(question_share=1.0).documents(0, 200)
    assert {d.kind for d in only} == {"question", "tagged"}
    # share 0 is the corpus before questions existed: the same documents, index by index
    assert PretrainCorpus(question_share=0.0).documents(0, 200) == PretrainCorpus().documents(
        0, 200) and "question" not in {d.kind for d in PretrainCorpus().documents(0, 200)}
    again = PretrainCorpus(question_share=0.5).documents(100, 50)
    assert again == got[100:150]  # deterministic by (seed, index)


def _recomputed_answer(question: str, scene) -> str:
    """The answer from the scene alone: the one object the question names, its attribute."""
    m = re.fullmatch(r"What colour is the (\w+)\?", question)
    if m:
        (obj,) = [o for o in scene.objects if o.shape == m.group(1)]  # uniquely identified
        return obj.colour
    m = re.fullmatch(r"What shape is the (\w+) object\?", question)
    assert m, question
    (obj,) = [o for o in scene.objects if o.colour == m.group(1)]
    return obj.shape


def test_questions_answer_an_attribute_recomputed_from_the_scene(asked):
    _, got = asked
    kinds = set()
    lettered = []
    for d in (d for d in got if d.kind == "question"):
        (scene,) = d.scenes
        question, listed = re.match(r"<image>User: (.*) Options: (.*)\n", d.text).groups()
        answer = re.fullmatch(r".*</think><answer>(\w+)</answer>", d.text, re.S).group(1)
        assert answer == _recomputed_answer(question, scene), d.text
        assert answer in OBJECT_COLOURS + SHAPES
        kinds.add("colour" if question.startswith("What colour") else "shape")
        assert not any(w in question.lower() for w in map(str.lower, CATEGORY_WORDS)), question
        assert stable_hash(scene_key(scene)) % 10  # never a held-out scene
        # the options: the answer among 2-4 distinct words of its vocabulary, as spatial_qa
        # lists them ("a, b or c"; "(A) a (B) b" lettered)
        lettered.append(listed.startswith("(A) "))
        options = (re.findall(r"\([A-D]\) (\w+)", listed) if lettered[-1]
                   else re.fullmatch(r"(.*) or (\w+)", listed).group(1).split(", ")
                   + [listed.rsplit(" or ", 1)[1]])
        vocabulary = OBJECT_COLOURS if answer in OBJECT_COLOURS else SHAPES
        assert 2 <= len(options) <= 4 and len(set(options)) == len(options), listed
        assert answer in options and set(options) <= set(vocabulary), listed
    assert kinds == {"colour", "shape"}
    assert 0.4 < np.mean(lettered) < 0.6


def test_question_think_text_is_the_scene_caption(asked):
    corpus, got = asked
    for d in (d for d in got if d.kind == "question"):
        (scene,) = d.scenes
        think = d.text.split(FRAME, 1)[1].split("</think>", 1)[0]
        n = len(scene.objects)
        assert think.startswith(f"{n} object{'' if n == 1 else 's'}: ")
        for o in scene.objects:
            assert f"a {o.colour} {o.shape} at ({o.x},{o.y})" in think
        assert all(f.holds for f in grounded_facts(think, scene)), think
        assert corpus.images(d).shape == (1, 32, 32, 3)


def test_question_frame_is_spatial_qa_think_frame(asked):
    from jaxrl_suite.envs.vision import SpatialQATask

    _, got = asked
    ref = SpatialQATask(prompt_style="think")
    for ex in ref.examples("train", 0, 8):  # the frame around spatial_qa's question + options
        asked_part = ex.meta.question + " Options: " + ex.prompt.split(" Options: ", 1)[1][
            : -len(FRAME)]
        frame = ex.prompt.replace(asked_part, "{}")
        assert frame == IMAGE_MARKER + "User: {}" + FRAME, frame
        assert think_answer_format(ref.solution(ex)) == 1.0
    for d in [d for d in got if d.kind == "question"][:200]:
        prompt, completion = d.text.split(FRAME, 1)
        question = prompt[len(IMAGE_MARKER + "User: "):]
        assert d.text.replace(question, "{}", 1).startswith(frame)
        assert think_answer_format(completion) == 1.0  # the prompt's <think> counted


def test_pretrain_task_cuts_a_question_at_the_think_frame():
    from jaxrl_suite.envs.vision import PretrainTask

    task = PretrainTask(question_share=0.5, max_chars=200)
    examples = task.examples("train", 0, 300)
    questions = [ex for ex in examples if ex.meta.kind == "question"]
    assert len(questions) > 40
    for ex in questions:
        assert ex.prompt.startswith(IMAGE_MARKER + "User: ") and ex.prompt.endswith(FRAME)
        assert len(ex.meta.scenes) == 1 and len(task.solution(ex)) <= 200
        assert task.solution(ex).endswith("</answer>")
    with pytest.raises(ValueError, match="question_share must be in"):
        PretrainCorpus(question_share=-0.1)


def _listed(listed: str) -> list[str]:
    """The options of a prompt's option list, lettered ("(A) x (B) y") or not ("x, y or z")."""
    if listed.startswith("(A) "):
        return re.findall(r"\([A-D]\) (\w+(?: \w+)?)(?= \(|$)", listed)
    head, last = listed.rsplit(" or ", 1)
    return head.split(", ") + [last]


def test_presence_questions_list_exactly_one_object_of_the_scene():
    corpus = PretrainCorpus(question_share=1.0, presence_share=0.5)
    got = [d for d in corpus.documents(0, 1500) if d.kind == "question"]
    presence = [d for d in got if "Which of these objects is in the image?" in d.text]
    assert abs(len(presence) / len(got) - 0.5) < 0.06
    for d in presence:
        (scene,) = d.scenes
        listed = re.match(r"<image>User: Which of these objects is in the image\? Options: "
                          r"(.*)\n", d.text).group(1)
        options = _listed(listed)
        answer = re.fullmatch(r".*</think><answer>(\w+ \w+)</answer>", d.text, re.S).group(1)
        names = {f"{o.colour} {o.shape}" for o in scene.objects}
        assert 2 <= len(options) <= 4 and len(set(options)) == len(options), listed
        assert [o for o in options if o in names] == [answer], (listed, names)
        assert all(o.split()[0] in OBJECT_COLOURS and o.split()[1] in SHAPES for o in options)
    # presence_share 0 leaves the attribute-question corpus as it was, document by document
    assert PretrainCorpus(question_share=0.5, presence_share=0.0).documents(0, 300) == \
        PretrainCorpus(question_share=0.5).documents(0, 300)


def test_kind_questions_list_exactly_one_option_of_the_asked_kind():
    from jaxrl_suite.envs.vision import SpatialQATask

    corpus = PretrainCorpus(question_share=1.0, presence_share=0.5, kind_share=1.0)
    got = [d for d in corpus.documents(0, 1500) if d.kind == "question"]
    kinds = [d for d in got if "User: Which of these is " in d.text]
    assert abs(len(kinds) / len(got) - 0.5) < 0.06  # every non-presence question
    # each kind's vocabulary, written out here: numbers, the relation answers, object names
    vocab = {"a number": {str(n) for n in range(10)},
             "a direction": {"left", "right", "above", "below"},
             "an object": {f"{c} {s}" for c in OBJECT_COLOURS for s in SHAPES}}
    asked, listed_kinds = set(), set()
    for d in kinds:
        kind, listed = re.match(r"<image>User: Which of these is (a number|a direction|an "
                                r"object)\? Options: (.*)\n", d.text).groups()
        options = _listed(listed)
        answer = re.fullmatch(r".*</think><answer>(.+)</answer>", d.text, re.S).group(1)
        assert 2 <= len(options) <= 4 and len(set(options)) == len(options), listed
        assert [o for o in options if o in vocab[kind]] == [answer], listed
        assert all(any(o in v for v in vocab.values()) for o in options), listed
        asked.add(kind)
        listed_kinds |= {k for k, v in vocab.items() if k != kind and set(options) & v}
        think = d.text.split(FRAME, 1)[1].split("</think>", 1)[0]
        assert all(f.holds for f in grounded_facts(think, d.scenes[0])), think  # the caption
    assert asked == listed_kinds == set(vocab)
    # the answers of count and relation questions are in the number and direction kinds
    for ex in SpatialQATask().examples("train", 0, 40):
        if ex.meta.category in ("count", "relation"):
            assert ex.answer in vocab["a number"] | vocab["a direction"], ex.answer
    # kind_share 0 leaves the corpus as it was, document by document
    assert PretrainCorpus(question_share=0.5, presence_share=0.5, kind_share=0.0).documents(
        0, 300) == PretrainCorpus(question_share=0.5, presence_share=0.5).documents(0, 300)
    with pytest.raises(ValueError, match="kind_share must be in"):
        PretrainCorpus(kind_share=1.5)


def test_tagged_options_list_the_answer_among_numbers_near_it():
    corpus = PretrainCorpus(tagged_options_share=0.5)
    tagged = [d for d in corpus.documents(0, 1500) if d.kind == "tagged"]
    listed = [d for d in tagged if " Options: " in d.text]
    assert abs(len(listed) / len(tagged) - 0.5) < 0.06
    for d in listed:
        options = _listed(re.search(r" Options: (.*)\n", d.text).group(1))
        answer = re.search(r"<answer>(\d+)</answer>", d.text).group(1)
        assert 2 <= len(options) <= 4 and len(set(options)) == len(options), d.text
        assert answer in options
        assert all(o.isdigit() and 0 < abs(int(o) - int(answer)) <= 5
                   for o in options if o != answer), d.text
        assert not any(w in d.text for w in SPATIAL_WORDS if w != "Options"), d.text
    # the rest of the document is the tagged document without options, and share 0 is the
    # corpus before tagged options existed
    plain = PretrainCorpus().documents(0, 1500)
    for d, p in zip(corpus.documents(0, 1500), plain, strict=True):
        assert re.sub(r" Options: [^\n]*", "", d.text) == p.text
