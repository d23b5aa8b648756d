"""The pretraining corpus that makes the R1-Zero study's "base" VLM (issue 46).

VisualThinker-R1-Zero (arXiv 2503.05132) starts GRPO from the pretrained base Qwen2-VL-2B and
relies on abilities pretraining left in it. Nothing pretrained can be loaded at our scale, so
this corpus puts those latent abilities there on purpose, and only those:

  * perception into text: captions of scenes that list the objects with their cells and say
    which object visibly covers which ("<image>3 objects: a red square at (0,1), a blue circle
    at (1,1), a green diamond at (3,2). the blue circle covers the red square.");
  * the tag format, from other domains: text-only `<think>...</think><answer>...</answer>`
    documents in the R1 prompt frame ("User: ...\\nAssistant: <think>"): arithmetic word
    problems, counting a word in a list, comparing two numbers. Never the spatial QA format: no
    image, no spatial or scene words (the tests check); a share (`tagged_options_share`) lists
    options after the question, the answer among 1-3 numbers within 5 of it ("Options: 12, 13,
    10 or 11"), the rest none;
  * self-correction: a small share (`correction_share`) of captions restate one object's cell
    after a wrong one ("a red square at (2,3), wait, no: at (0,1)"), the corrected fact right;
  * the frame after an image: a share (`question_share`) of the image documents ask an
    *attribute* question about their scene in spatial_qa's think frame with its option list,
    byte for byte ("<image>User: What colour is the triangle? Options: red, blue or
    cyan\nAssistant: <think>" + the scene's caption + "</think><answer>blue</answer>"): the
    colour of the only object of its shape, or the shape of the only object of its colour
    ("What shape is the blue object?"), the right word among 2-4 options drawn from the same
    vocabulary (colours or shapes), shuffled, lettered "(A) blue (B) red" on half of them as
    the held-out set letters its options; the answer is the word. Scenes where neither
    attribute is unique are redrawn. A share (`presence_share`) of the questions asks instead
    "Which of these objects is in the image?" among 2-4 full object names, exactly one of them
    in the scene (the answer: its name, as depth and distance answers are names); the answer
    needs the options, where an attribute can be read off the image without them. A share
    (`kind_share`) of the other questions are *kind* questions instead of attribute ones:
    "Which of these is a number? Options: left, 3 or red square" -> the one listed option of
    the asked kind (a number 0-9, a direction word left / right / above / below, or an object
    name) among 1-3 options of the other kinds: picking a listed number or direction word
    after an image, with nothing asked about where anything is. Never a
    count, relation, depth or distance question (docs/r1zero.md: the base must have seen
    image -> `<think>` reading the scene -> picking one of the offered options in `<answer>`,
    which the anchor's base brings from its pretraining; the spatial skills stay RL's).

So the base model can describe a scene, can write the tag format, also right after an image,
has seen "wait, no:" fix a fact, and has never been asked a spatial question. Scenes are drawn
like spatial_qa's (`scene.draw_scene`, 1..6 objects by default, legible) and are never held-out
scenes: a scene
whose key falls in the test bucket (the Task hash rule) is redrawn, so no spatial_qa test scene
is ever seen in pretraining.

Documents are deterministic by (seed, index): `corpus.document(i)`; kind by index: an image
document with probability `caption_share` (of which `question_share` are questions, a share
`presence_share` of them presence questions, of the rest a share `kind_share` kind questions,
the others attribute questions; the rest captions),
else a tagged document (`tagged_options_share` of them with options). `question_share` 0 gives
exactly the documents of the corpus before questions existed, `presence_share` 0 those before
presence questions, `kind_share` 0 those before kind questions, `tagged_options_share` 0
those before tagged options (each coin has its own stream).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import numpy as np

from jaxrl_suite.envs.text.base import TEST_BUCKETS, Example, Task, split_index, stable_hash
from jaxrl_suite.envs.vision.base import IMAGE_MARKER, MAX_DRAWS, options_text
from jaxrl_suite.envs.vision.scene import (
    OBJECT_COLOURS,
    SHAPES,
    Scene,
    cell_text,
    draw_scene,
    legible,
    render_scenes,
    scene_key,
    visible_occlusions,
)
from jaxrl_suite.rewards.format import answer_tags
from jaxrl_suite.rewards.r1zero import THINK_CLOSE, THINK_OPEN

DOC_KINDS = ("caption", "question", "tagged")
TAGGED_DOMAINS = ("arithmetic", "count_list", "compare")
_NAMES = ("tom", "ana", "li", "sam", "eva", "max")
_ITEMS = ("apples", "books", "coins", "cards", "stones", "pens")
_WORDS = ("cat", "dog", "bird", "fish", "frog", "bee")


class PretrainDoc(NamedTuple):
    """One document: its text (a caption or question starts with IMAGE_MARKER), its scenes
    (one for a caption or question, none for a tagged document), its kind and whether it holds
    a self-correction."""

    text: str
    scenes: tuple[Scene, ...]
    kind: str  # one of DOC_KINDS
    corrected: bool = False


def _caption(rng: np.random.Generator, scene: Scene, correct: bool) -> str:
    """IMAGE_MARKER, then the scene's objects in reading order and its visible occlusions."""
    objs = sorted(scene.objects, key=lambda o: (o.y, o.x))  # reading order
    parts = [f"a {o.name} at {cell_text(*o.cell)}" for o in objs]
    if correct:
        k = int(rng.integers(len(objs)))
        o = objs[k]
        wrong = [(x, y) for y in range(scene.grid) for x in range(scene.grid) if (x, y) != o.cell]
        w = wrong[int(rng.integers(len(wrong)))]
        parts[k] = f"a {o.name} at {cell_text(*w)}, wait, no: at {cell_text(*o.cell)}"
    n = len(objs)
    text = f"{n} object{'' if n == 1 else 's'}: " + ", ".join(parts) + "."
    for near, far in visible_occlusions(scene):
        text += f" the {near.name} covers the {far.name}."
    return IMAGE_MARKER + text


def _arithmetic(rng: np.random.Generator) -> tuple[str, str, int]:
    who, item = _NAMES[int(rng.integers(len(_NAMES)))], _ITEMS[int(rng.integers(len(_ITEMS)))]
    a, b = int(rng.integers(2, 20)), int(rng.integers(1, 10))
    if rng.integers(2):
        return (f"{who} has {a} {item} and gets {b} more. How many {item} now?",
                f"{a} + {b} = {a + b}.", a + b)
    b = min(b, a - 1)
    return (f"{who} has {a} {item} and gives away {b}. How many {item} now?",
            f"{a} - {b} = {a - b}.", a - b)


def _count_list(rng: np.random.Generator) -> tuple[str, str, int]:
    words = [_WORDS[int(i)] for i in rng.integers(0, len(_WORDS), int(rng.integers(3, 9)))]
    target = words[int(rng.integers(len(words)))]
    steps, k = [], 0
    for w in words:
        k += w == target
        steps.append(f"{w} {k}" if w == target else w)
    return (f"How many times does {target} appear in: {' '.join(words)}?",
            ", ".join(steps) + f". so {k}.", k)


def _compare(rng: np.random.Generator) -> tuple[str, str, int]:
    a, b = (int(v) for v in rng.choice(100, size=2, replace=False))
    word, pick = ("larger", max(a, b)) if rng.integers(2) else ("smaller", min(a, b))
    sign = ">" if a > b else "<"
    return f"Which is {word}, {a} or {b}?", f"{a} {sign} {b}. {word}: {pick}.", pick


def _attribute_question(rng: np.random.Generator, scene: Scene) -> tuple[str, str] | None:
    """(question with its options, one-word answer) about a uniquely identified object of
    `scene`: the colour of the only object of its shape, or the shape of the only object of its
    colour, then " Options: " and the answer among 2-4 words of its vocabulary (shuffled;
    lettered with probability 1/2); None when no object is unique either way."""
    asks = []
    for o in scene.objects:
        if sum(p.shape == o.shape for p in scene.objects) == 1:
            asks.append((f"What colour is the {o.shape}?", o.colour, OBJECT_COLOURS))
        if sum(p.colour == o.colour for p in scene.objects) == 1:
            asks.append((f"What shape is the {o.colour} object?", o.shape, SHAPES))
    if not asks:
        return None
    question, answer, words = asks[int(rng.integers(len(asks)))]
    return _with_options(rng, question, answer, [w for w in words if w != answer])


def _presence_question(rng: np.random.Generator, scene: Scene) -> tuple[str, str]:
    """("Which of these objects is in the image? Options: ...", the full name of the one listed
    object that is in `scene`): one object of the scene among 1-3 names of objects it lacks."""
    present = scene.objects[int(rng.integers(len(scene.objects)))].name
    names = {o.name for o in scene.objects}
    absent = [f"{c} {s}" for c in OBJECT_COLOURS for s in SHAPES if f"{c} {s}" not in names]
    return _with_options(rng, "Which of these objects is in the image?", present, absent)


# a kind question's kinds: (the word the question uses, the options of that kind)
OPTION_KINDS = {"number": ("a number", tuple(str(n) for n in range(10))),
         "direction": ("a direction", ("left", "right", "above", "below")),
         "object": ("an object", tuple(f"{c} {s}" for c in OBJECT_COLOURS for s in SHAPES))}


def _kind_question(rng: np.random.Generator) -> tuple[str, str]:
    """("Which of these is a number? Options: ...", the one listed option of that kind): an
    option of a random kind among 1-3 options drawn from 3 words of each other kind
    (`OPTION_KINDS`; so both other kinds are as likely to be listed)."""
    kind = tuple(OPTION_KINDS)[int(rng.integers(len(OPTION_KINDS)))]
    words = OPTION_KINDS[kind][1]
    others = [ws[int(i)] for k, (_, ws) in OPTION_KINDS.items() if k != kind
              for i in rng.choice(len(ws), size=3, replace=False)]
    return _with_options(rng, f"Which of these is {OPTION_KINDS[kind][0]}?",
                         words[int(rng.integers(len(words)))], others)


def _with_options(rng: np.random.Generator, question: str, answer: str,
                  others: list[str]) -> tuple[str, str]:
    """(question + " Options: " + `answer` among 1-3 of `others`, shuffled, lettered with
    probability 1/2; `answer`)."""
    picked = rng.choice(len(others), size=int(rng.integers(1, 4)), replace=False)
    options = [answer] + [others[int(i)] for i in picked]
    options = [options[int(i)] for i in rng.permutation(len(options))]
    return f"{question} Options: {options_text(options, bool(rng.integers(2)))}", answer


def _framed(question: str, think: str, answer: str, image: bool = False) -> str:
    """spatial_qa's think frame (its prompt less the options): "[IMAGE_MARKER]User: question
    \\nAssistant: <think>think</think><answer>answer</answer>"."""
    head = f"{IMAGE_MARKER if image else ''}User: {question}\nAssistant: {THINK_OPEN}"
    return f"{head}{think}{THINK_CLOSE}{answer_tags(answer)}"


# domain -> rng -> (question, reasoning, answer)
_DOMAINS = {"arithmetic": _arithmetic, "count_list": _count_list, "compare": _compare}
assert tuple(_DOMAINS) == TAGGED_DOMAINS


def _tagged(rng: np.random.Generator, listed: np.random.Generator | None = None) -> str:
    """A tagged document of a random domain; with `listed` (an rng), its question carries an
    option list: the answer among 1-3 numbers within 5 of it (`_with_options`)."""
    domain = TAGGED_DOMAINS[int(rng.integers(len(TAGGED_DOMAINS)))]
    q, think, ans = _DOMAINS[domain](rng)
    if listed is not None:
        near = [str(v) for v in range(max(0, ans - 5), ans + 6) if v != ans]
        q = _with_options(listed, q, str(ans), near)[0]
    return _framed(q, think, str(ans))


@dataclasses.dataclass(frozen=True)
class PretrainCorpus:
    """The base VLM's pretraining documents (module docstring).

    Fields: `caption_share` of documents that show an image, the rest text-only tagged
    documents; `question_share` of the image documents that are questions in the think frame
    (`presence_share` of those presence questions, of the rest `kind_share` kind questions,
    the others attribute questions), the rest
    (image, caption) pairs; `tagged_options_share` of the tagged documents with options;
    `correction_share` of captions with a self-correction; `objects` the inclusive range of
    objects per scene.
    """

    seed: int = 0
    caption_share: float = 0.5
    correction_share: float = 0.05
    objects: tuple[int, int] = (1, 6)
    question_share: float = 0.0
    presence_share: float = 0.0
    tagged_options_share: float = 0.0
    kind_share: float = 0.0

    def __post_init__(self):
        for field in ("caption_share", "correction_share", "question_share", "presence_share",
                      "tagged_options_share", "kind_share"):
            if not 0.0 <= getattr(self, field) <= 1.0:
                raise ValueError(f"PretrainCorpus: {field} must be in [0, 1], got "
                                 f"{getattr(self, field)}")
        lo, hi = self.objects
        if not 1 <= lo <= hi <= 8:
            raise ValueError(f"PretrainCorpus: objects must satisfy 1 <= lo <= hi <= 8, got "
                             f"{self.objects}")

    def document(self, index: int) -> PretrainDoc:
        """Document `index`: a pure function of (fields, seed, index)."""
        if index < 0:
            raise ValueError(f"index must be >= 0, got {index}")
        rng = np.random.default_rng([self.seed, index])
        if rng.random() >= self.caption_share:
            listed = np.random.default_rng([self.seed, index, 3])
            return PretrainDoc(_tagged(rng, listed if listed.random() < self.tagged_options_share
                                       else None), (), "tagged")
        correct = bool(rng.random() < self.correction_share)
        ask = np.random.default_rng([self.seed, index, 1]).random() < self.question_share
        presence = np.random.default_rng([self.seed, index, 2]).random() < self.presence_share
        kind = np.random.default_rng([self.seed, index, 4]).random() < self.kind_share
        lo, hi = self.objects
        for _ in range(MAX_DRAWS):
            scene = draw_scene(rng, int(rng.integers(lo, hi + 1)))
            if not (stable_hash(scene_key(scene)) % TEST_BUCKETS and legible(scene)):
                continue
            if not ask:
                return PretrainDoc(_caption(rng, scene, correct), (scene,), "caption", correct)
            qa = (_presence_question(rng, scene) if presence else _kind_question(rng) if kind
                  else _attribute_question(rng, scene))
            if qa is not None:
                think = _caption(rng, scene, False)[len(IMAGE_MARKER):]
                return PretrainDoc(_framed(qa[0], think, qa[1], image=True), (scene,),
                                   "question")
        raise RuntimeError(f"{self!r}: no training scene found in {MAX_DRAWS} draws")

    def documents(self, start: int, n: int) -> list[PretrainDoc]:
        """`[document(i) for i in range(start, start + n)]`."""
        return [self.document(i) for i in range(start, start + n)]

    def images(self, doc: PretrainDoc) -> np.ndarray:
        """uint8 [n_images, H, W, 3] of the document's scenes (n_images = 0 for a tagged
        document: shape [0, 32, 32, 3])."""
        return render_scenes(doc.scenes)


class PretrainMeta(NamedTuple):
    """`Example.meta` of a `PretrainTask` example: the document's scenes, kind, correction."""

    scenes: tuple[Scene, ...]
    kind: str
    corrected: bool


_SPLIT_OFFSET = 10**12  # the test split's documents start here (never reached by training)
_RETRY_STRIDE = 10**9  # a document too long for max_chars is replaced by index + k * stride


@dataclasses.dataclass(frozen=True)
class PretrainTask(Task):
    """The corpus as a `Task`, so the SFT trainer pretrains on it: example i is document i cut
    into a prompt (a caption: IMAGE_MARKER; a question or tagged document: up to and including
    "Assistant: <think>") and its continuation, the `solution` the loss is taken on (the rest
    of the document). Documents longer than `max_chars` characters after the prompt are
    replaced by the first that fits of document(i + k * 1e9), k = 1, 2, ... (deterministic; a
    fixed sequence length). The test split reads documents from 1e12 on. `score` is 1.0 for
    an exact continuation (the stripped completion equals the solution)."""

    name: ClassVar[str] = "vision_pretrain"
    max_images: ClassVar[int] = 1
    seed: int = 0
    caption_share: float = 0.5
    correction_share: float = 0.05
    objects: tuple[int, int] = (1, 6)
    max_chars: int = 255
    question_share: float = 0.0
    presence_share: float = 0.0
    tagged_options_share: float = 0.0
    kind_share: float = 0.0

    def __post_init__(self):
        self.corpus  # noqa: B018 - validates the corpus fields
        if self.max_chars < 64:
            raise ValueError(f"PretrainTask: max_chars must be >= 64, got {self.max_chars}")

    @property
    def corpus(self) -> PretrainCorpus:
        return PretrainCorpus(seed=self.seed, caption_share=self.caption_share,
                              correction_share=self.correction_share, objects=self.objects,
                              question_share=self.question_share,
                              presence_share=self.presence_share,
                              tagged_options_share=self.tagged_options_share,
                              kind_share=self.kind_share)

    @staticmethod
    def _cut(doc: PretrainDoc) -> tuple[str, str]:
        if doc.kind == "caption":
            return IMAGE_MARKER, doc.text[len(IMAGE_MARKER):]
        head, tail = doc.text.split(THINK_OPEN, 1)
        return head + THINK_OPEN, tail

    def _generate(self, rng: np.random.Generator) -> Example:
        return self.example("train", int(rng.integers(_RETRY_STRIDE)))

    def example(self, split: str, index: int) -> Example:
        base = index + (_SPLIT_OFFSET if split_index(split) == 1 else 0)
        corpus = self.corpus
        for k in range(MAX_DRAWS):
            doc = corpus.document(base + k * _RETRY_STRIDE)
            prompt, rest = self._cut(doc)
            if len(rest) <= self.max_chars:
                return Example(prompt, rest, PretrainMeta(doc.scenes, doc.kind, doc.corrected))
        raise RuntimeError(f"{self!r}: no document of <= {self.max_chars} chars")

    def solution(self, ex: Example) -> str:
        return ex.answer

    def score(self, completion: str, ex: Example) -> float:
        return float(completion.strip() == ex.answer.strip())


__all__ = ["DOC_KINDS", "OPTION_KINDS", "TAGGED_DOMAINS", "PretrainCorpus", "PretrainDoc",
           "PretrainMeta",
           "PretrainTask"]
