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
