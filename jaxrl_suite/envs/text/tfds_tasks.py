"""Dataset-backed verifiable text tasks: TFDS adapters (GSM8K, AG News, IMDB, TriviaQA, NQ-Open)
and a local JSONL file, behind the same `Task` interface as the generated tasks.

Each adapter maps one dataset record to an `Example` (prompt, canonical answer, meta with what the
checker needs) and defines a programmatic reward on the `<answer>...</answer>` content:

    task        TFDS name                  our split -> TFDS split       reward (`score`)
    gsm8k       gsm8k                      train, test                   numeric match (1/0)
    ag_news     ag_news_subset             train, test                   label match (1/0)
    imdb        imdb_reviews/plain_text    train, test                   label match (1/0)
    trivia_qa   trivia_qa/rc.nocontext     train, test -> validation     SQuAD EM or F1
    nq_open     natural_questions_open     train, test -> validation     SQuAD EM or F1
    jsonl       (a local file, `path=`)    hash split or `test_path=`    numeric or exact match

Indexing. `example(split, i)` is a pure function of (params, seed, split, i): the split's records
are visited in a fixed permutation drawn from (seed, split), and the index wraps around modulo the
split size (`example(split, i) == example(split, i % size(split))`), so an integer data cursor
works forever and every epoch repeats the same order. `shuffle_test=False` keeps the test split
in dataset order instead (the first N test problems are then the same for every seed). Train and
test are the dataset's own splits, disjoint as far as the dataset is. `_generate` (unused by
`example`) draws a uniformly random train problem.

Loading. Data is read lazily on first use and cached per process (`clear_dataset_cache`). TFDS
data is never downloaded: it is read with `tfds.data_source(..., download=False)`, a random-access
reader that needs no TensorFlow, when the dataset was prepared as array_record; a dataset prepared
as tfrecord (TFDS's default) cannot be read that way, and then the split is read once, whole,
with `tfds.load(..., download=False)` + `tfds.as_numpy`, which needs TensorFlow. Prepare the data
once, on a machine with network access, preferably as array_record:

    python -c "import tensorflow_datasets as tfds; \\
        tfds.builder('gsm8k', data_dir=DIR).download_and_prepare(file_format='array_record')"

then pass `data_dir=DIR` (default: TFDS's, $TFDS_DATA_DIR or ~/tensorflow_datasets). TFDS needs
the optional extra: `pip install -e ".[tfds]"`. TFDS text features (bytes) are decoded as UTF-8.

Answer checks: `jaxrl_suite.rewards` (`numeric_match` / `parse_number` for GSM8K and numeric JSONL
answers, `string_match` for labels and plain JSONL answers, and SQuAD's `normalize_answer`,
`exact_match` and `token_f1`); the last four are re-exported here.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import string
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np

from jaxrl_suite.envs.text.base import (
    TASKS,
    Example,
    Task,
    split_index,
    stable_hash,
)
from jaxrl_suite.rewards.format import answer_tags, extract_answer
from jaxrl_suite.rewards.match import (
    best_match,
    normalize_text,
    numeric_match,
    parse_number,
    string_match,
)
from jaxrl_suite.rewards.qa import QA_METRICS, exact_match, normalize_answer, token_f1

_TEST_BUCKETS = 10_000  # JSONL: test iff stable_hash(prompt) % 10_000 < fraction * 10_000

GSM8K_TEMPLATE = "Question: {question}\nGive the final number inside <answer></answer>.\n"
CLASSIFY_TEMPLATE = (
    "Text: {text}\nLabels: {labels}\nAnswer with one label inside <answer></answer>.\n"
)
QA_TEMPLATE = "Question: {question}\nAnswer inside <answer></answer>.\n"

_CALCULATOR = re.compile(r"<<[^<>]*>>")  # GSM8K's calculator annotations, e.g. "<<48/2=24>>"


# ----------------------------------------------------------------------------- base classes


@functools.lru_cache(maxsize=64)
def _permutation(n: int, seed: int, split_id: int) -> np.ndarray:
    return np.random.default_rng([seed, split_id]).permutation(n)


def _template_fields(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}


def _check_template(task: str, template: str, allowed: set[str], required: set[str]) -> None:
    try:
        fields = _template_fields(template)
    except ValueError as err:
        raise ValueError(f"{task}: malformed template {template!r} ({err})") from None
    unknown, missing = fields - allowed, required - fields
    if unknown or missing:
        raise ValueError(
            f"{task}: template {template!r} must use the placeholders {sorted(required)} "
            f"(allowed {sorted(allowed)}); unknown {sorted(unknown)}, missing {sorted(missing)}"
        )


@dataclasses.dataclass(frozen=True)
class DatasetTask(Task):
    """A task over a fixed, finite dataset: problems are dataset records, indexed directly.

    Subclasses implement `_records(split)` (a sized, indexable sequence of raw records, loaded
    lazily and cached) and `_to_example(record)`, plus `solution` and `score`. `example(split, i)`
    visits the records in a permutation drawn from (seed, split), wrapping around modulo the
    split size; with `shuffle_test=False` the test split keeps the dataset order.
    """

    seed: int = 0
    shuffle_test: bool = True

    def _records(self, split: str) -> Sequence[Any]:
        """The raw records of our split `split` ("train" or "test"), in dataset order."""
        raise NotImplementedError

    def _to_example(self, record: Any) -> Example:
        """One raw record as an `Example`; raises ValueError/KeyError on a malformed record."""
        raise NotImplementedError

    def _where(self, split: str) -> str:
        """Names the data of `split` in error messages."""
        return f"{self.name} split {split!r}"

    def size(self, split: str) -> int:
        """Number of problems in `split` (loads it)."""
        split_index(split)
        return len(self._records(split))

    def example(self, split: str, index: int) -> Example:
        """Problem `index` of `split`: record perm[index % size] of the split, where perm is a
        permutation drawn from (seed, split) (the identity for "test" if not shuffle_test)."""
        split_id = split_index(split)
        if index < 0:
            raise ValueError(f"index must be >= 0, got {index}")
        records = self._records(split)
        n = len(records)
        if n == 0:
            raise ValueError(f"{self._where(split)} is empty")
        k = index % n
        if split == "train" or self.shuffle_test:
            k = int(_permutation(n, self.seed, split_id)[k])
        try:
            return self._to_example(records[k])
        except (KeyError, ValueError, TypeError) as err:
            detail = f"missing field {err}" if isinstance(err, KeyError) else str(err)
            raise ValueError(f"{self._where(split)} record {k}: {detail}") from None

    def solution(self, ex: Example) -> str:
        """The SFT target: the canonical answer in answer tags."""
        return answer_tags(ex.answer)

    def _generate(self, rng: np.random.Generator) -> Example:
        """A uniformly random train problem (`example` indexes the splits directly instead)."""
        return self.example("train", int(rng.integers(self.size("train"))))


# ----------------------------------------------------------------------------- TFDS loading

SOURCE_CACHE: dict[tuple, Any] = {}  # loaded splits and label names, keyed by what they depend on
_DEFAULT_DIR = "the default data_dir ($TFDS_DATA_DIR or ~/tensorflow_datasets)"


def clear_dataset_cache() -> None:
    """Forgets every loaded split (TFDS and JSONL), e.g. between tests with different mocks."""
    SOURCE_CACHE.clear()


def _import_tfds():
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise ImportError("tensorflow_datasets is not installed; run "
                          "`pip install -e \".[tfds]\"` to use the TFDS text tasks") from None
    return tfds


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _how_to_prepare(name: str) -> str:
    return (f"prepare it once, on a machine with network access: python -c \"import "
            f"tensorflow_datasets as tfds; tfds.builder('{name}', data_dir=DIR)"
            f".download_and_prepare(file_format='array_record')\", then pass data_dir=DIR")


def _not_prepared(name: str, where: str) -> FileNotFoundError:
    return FileNotFoundError(f"TFDS dataset '{name}' is not prepared in {where}; "
                             f"{_how_to_prepare(name)}")


def _load_error(name: str, where: str, err: BaseException) -> Exception:
    """A one-line error for a TFDS dataset that cannot be opened."""
    if type(err).__name__ == "DatasetNotFoundError":
        return ValueError(f"TFDS dataset '{name}' is not a registered TFDS dataset "
                          f"({_first_line(err)})")
    if isinstance(err, AssertionError | OSError) or type(err).__name__ == "NotFoundError":
        return _not_prepared(name, where)
    return ValueError(f"TFDS dataset '{name}' could not be loaded from {where} "
                      f"({type(err).__name__}: {_first_line(err)})")


def _tfds_split(name: str, split: str, data_dir: str | None,
                fields: tuple[str, ...]) -> Sequence[Any]:
    """A TFDS split as a sized, indexable sequence of records (dicts with at least `fields`).

    array_record data: the `tfds.data_source` itself (random access, no TensorFlow, nothing
    read up front). tfrecord data (data_source raises NotImplementedError): the whole split read
    once with `tfds.load` + `tfds.as_numpy` (needs TensorFlow) into a list of dicts of `fields`.
    Never downloads. Cached per (name, split, data_dir).
    """
    key = ("tfds", name, split, data_dir, fields)
    if key in SOURCE_CACHE:
        return SOURCE_CACHE[key]
    tfds = _import_tfds()
    where = data_dir if data_dir is not None else _DEFAULT_DIR
    try:
        records = tfds.data_source(name, split=split, data_dir=data_dir, download=False)
    except (NotImplementedError, ImportError):  # tfrecord, not prepared, or no array_record
        records = _load_whole_split(tfds, name, split, data_dir, where, fields)
    except Exception as err:  # DatasetNotFoundError, unknown config or split, missing files, ...
        raise _load_error(name, where, err) from None
    if len(records):
        _check_fields(name, split, records[0], fields)
    SOURCE_CACHE[key] = records
    return records


def _check_fields(name: str, split: str, record: Any, fields: tuple[str, ...]) -> None:
    missing = [f for f in fields if f not in record]
    if missing:
        raise ValueError(f"TFDS dataset '{name}' split '{split}' records lack field(s) "
                         f"{missing}; they have {sorted(record)}")


def _load_whole_split(tfds, name: str, split: str, data_dir: str | None, where: str,
                      fields: tuple[str, ...]) -> list[dict[str, Any]]:
    rows, keys = [], None
    try:
        ds = tfds.load(name, split=split, data_dir=data_dir, download=False,
                       shuffle_files=False)
        for ex in tfds.as_numpy(ds):
            keys = tuple(ex) if keys is None else keys
            rows.append({f: ex[f] for f in fields if f in ex})
    except ImportError:
        raise ImportError(f"TFDS dataset '{name}' in {where} is stored as tfrecord, which needs "
                          f"TensorFlow to read: `pip install -e \".[tfds]\"`, or prepare it "
                          f"again with file_format='array_record'") from None
    except Exception as err:  # AssertionError: not prepared; ...
        raise _load_error(name, where, err) from None
    if keys is not None:
        _check_fields(name, split, dict.fromkeys(keys), fields)
    return rows


def _text(value: Any) -> str:
    """A TFDS text value (bytes, str or a 0-d array of either) as str."""
    if isinstance(value, np.ndarray):
        value = value.item()
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, str):
        return value
    raise TypeError(f"expected text, got {type(value).__name__}")


def _texts(values: Any) -> list[str]:
    """A TFDS text sequence (array or list of bytes/str) as a list of str."""
    if isinstance(values, str | bytes):
        return [_text(values)]
    return [_text(v) for v in np.asarray(values, dtype=object).reshape(-1)]


@dataclasses.dataclass(frozen=True)
class TfdsTask(DatasetTask):
    """A `DatasetTask` over a TFDS dataset, read from `data_dir` (never downloaded).

    Class constants: `tfds_name` (with config, if any), `tfds_splits` (our split -> TFDS split)
    and `record_fields` (the record fields the adapter reads).
    """

    data_dir: str | None = None

    tfds_name: ClassVar[str]
    tfds_splits: ClassVar[dict[str, str]] = {"train": "train", "test": "test"}
    record_fields: ClassVar[tuple[str, ...]]

    def _dataset(self) -> str:
        return self.tfds_name

    def _resolved_data_dir(self) -> str | None:
        return None if self.data_dir is None else os.path.expanduser(self.data_dir)

    def _records(self, split: str) -> Sequence[Any]:
        return _tfds_split(self._dataset(), self.tfds_splits[split], self._resolved_data_dir(),
                           self.record_fields)

    def _where(self, split: str) -> str:
        return f"TFDS dataset '{self._dataset()}' split '{self.tfds_splits[split]}'"


# ----------------------------------------------------------------------------- GSM8K


def gsm8k_final_answer(answer: str) -> str:
    """The number after the last "####" of a GSM8K answer, commas and `$` removed:
    "...\\n#### 1,234" -> "1234". Raises ValueError if there is none."""
    _, sep, tail = answer.rpartition("####")
    number = tail.strip().removesuffix(".")
    if not sep or parse_number(number) is None:
        raise ValueError(f"answer has no '#### <number>' line (ends {answer[-40:]!r})")
    return number.replace(",", "").replace("$", "")


@dataclasses.dataclass(frozen=True)
class Gsm8kTask(TfdsTask):
    """GSM8K grade-school math word problems (TFDS `gsm8k`: `question`, `answer`).

    Prompt: `template` with `{question}` (default `GSM8K_TEMPLATE`). Answer: the number after
    the last "####" of the reference `answer`, commas removed ("1,234" -> "1234"); meta: (the
    rationale before "####", with GSM8K's "<<48/2=24>>" calculator annotations removed,).

    Reward (`score`): 1.0 iff the first `<answer>` content is one number (`parse_number`:
    whitespace, a trailing period, `$` and thousands commas ignored) equal in value to the
    reference ("72.0" and "$72" match 72), else 0.0. `solution`: "<answer>N</answer>", or the
    rationale, a newline and "<answer>N</answer>" with `rationale=True` (both score 1.0).
    """

    name: ClassVar[str] = "gsm8k"
    tfds_name: ClassVar[str] = "gsm8k"
    record_fields: ClassVar[tuple[str, ...]] = ("question", "answer")
    rationale: bool = False
    template: str = GSM8K_TEMPLATE

    def __post_init__(self):
        _check_template(self.name, self.template, {"question"}, {"question"})

    def _to_example(self, record) -> Example:
        answer = _text(record["answer"])
        number = gsm8k_final_answer(answer)
        steps = _CALCULATOR.sub("", answer.rpartition("####")[0]).strip()
        question = _text(record["question"]).strip()
        return Example(prompt=self.template.format(question=question), answer=number,
                       meta=(steps,))

    def solution(self, ex: Example) -> str:
        if self.rationale and ex.meta[0]:
            return f"{ex.meta[0]}\n{answer_tags(ex.answer)}"
        return answer_tags(ex.answer)

    def score(self, completion: str, ex: Example) -> float:
        return numeric_match(extract_answer(completion), ex.answer)

    def feedback(self, completion: str, ex: Example) -> str:
        """"no answer" / "not a number" / "wrong" / "correct"."""
        content = extract_answer(completion)
        if content is None:
            return "no answer"
        if parse_number(content) is None:
            return "not a number"
        return "correct" if self.is_correct(completion, ex) else "wrong"


# ----------------------------------------------------------------------------- classification


@dataclasses.dataclass(frozen=True)
class ClassificationTask(TfdsTask):
    """Text classification as generation: answer the label's name.

    Prompt: `template` with `{text}` and `{labels}` (default `CLASSIFY_TEMPLATE`); {text} is the
    record's `text_fields` joined by newlines (cut to `max_text_chars` if set), {labels} the
    label names joined by ", ". Label names: the dataset's ClassLabel names, or `label_names`
    (same count, in label order). Answer: the label's name; meta: (label index, label names).

    Reward (`score`): 1.0 iff the first `<answer>` content, stripped and case-folded, equals the
    label name case-folded, else 0.0.
    """

    label_names: tuple[str, ...] | None = None
    max_text_chars: int | None = None
    template: str = CLASSIFY_TEMPLATE

    text_fields: ClassVar[tuple[str, ...]]
    label_field: ClassVar[str] = "label"

    def __post_init__(self):
        _check_template(self.name, self.template, {"text", "labels"}, {"text"})
        if self.label_names is not None:
            names = tuple(str(n) for n in self.label_names)
            object.__setattr__(self, "label_names", names)  # a YAML list -> a hashable tuple
            if len(names) < 2 or len({n.strip().casefold() for n in names}) != len(names):
                raise ValueError(f"{self.name}: label_names must be >= 2 distinct names, got "
                                 f"{list(names)}")
        if self.max_text_chars is not None and self.max_text_chars < 1:
            raise ValueError(f"{self.name}: max_text_chars must be >= 1 or None, got "
                             f"{self.max_text_chars}")

    def labels(self) -> tuple[str, ...]:
        """The label names used in prompts and answers, in label order."""
        names = _class_names(self._dataset(), self._resolved_data_dir(), self.label_field)
        if self.label_names is None:
            return names
        if len(self.label_names) != len(names):
            raise ValueError(f"{self.name}: label_names has {len(self.label_names)} names but "
                             f"TFDS dataset '{self._dataset()}' has {len(names)} classes {names}")
        return self.label_names

    def _records(self, split: str) -> Sequence[Any]:
        self.labels()  # label errors surface here, not as a malformed record
        return super()._records(split)

    def _to_example(self, record) -> Example:
        names = self.labels()
        label = int(np.asarray(record[self.label_field]))
        if not 0 <= label < len(names):
            raise ValueError(f"label {label} is not in [0, {len(names)})")
        text = "\n".join(_text(record[f]).strip() for f in self.text_fields)
        if self.max_text_chars is not None:
            text = text[: self.max_text_chars]
        prompt = self.template.format(text=text, labels=", ".join(names))
        return Example(prompt=prompt, answer=names[label], meta=(label, names))

    def score(self, completion: str, ex: Example) -> float:
        return string_match(extract_answer(completion), ex.answer, normalize=str.casefold)


def _class_names(name: str, data_dir: str | None, field: str) -> tuple[str, ...]:
    key = ("labels", name, data_dir, field)
    if key not in SOURCE_CACHE:
        tfds = _import_tfds()
        where = data_dir if data_dir is not None else _DEFAULT_DIR
        try:
            feature = tfds.builder(name, data_dir=data_dir).info.features[field]
        except Exception as err:
            raise _load_error(name, where, err) from None
        SOURCE_CACHE[key] = tuple(str(n) for n in feature.names)
    return SOURCE_CACHE[key]


@dataclasses.dataclass(frozen=True)
class AgNewsTask(ClassificationTask):
    """AG News topic classification (TFDS `ag_news_subset`: `title`, `description`, `label` in
    World / Sports / Business / Sci/Tech); {text} is the title, a newline and the description.
    Reward: exact label-name match (see `ClassificationTask`)."""

    name: ClassVar[str] = "ag_news"
    tfds_name: ClassVar[str] = "ag_news_subset"
    record_fields: ClassVar[tuple[str, ...]] = ("title", "description", "label")
    text_fields: ClassVar[tuple[str, ...]] = ("title", "description")


@dataclasses.dataclass(frozen=True)
class ImdbTask(ClassificationTask):
    """IMDB movie-review sentiment (TFDS `imdb_reviews/plain_text`: `text`, `label` in neg / pos;
    e.g. `label_names=("negative", "positive")`; reviews are long, see `max_text_chars`).
    Reward: exact label-name match (see `ClassificationTask`)."""

    name: ClassVar[str] = "imdb"
    tfds_name: ClassVar[str] = "imdb_reviews/plain_text"
    record_fields: ClassVar[tuple[str, ...]] = ("text", "label")
    text_fields: ClassVar[tuple[str, ...]] = ("text",)


# ----------------------------------------------------------------------------- QA


@dataclasses.dataclass(frozen=True)
class QaTask(TfdsTask):
    """Short-answer open-domain QA, scored against every accepted answer (alias).

    Prompt: `template` with `{question}` (default `QA_TEMPLATE`). Answer: the canonical answer;
    meta: the accepted answers (canonical first, duplicates removed).

    Reward (`score`), with a, b normalised by `normalize_answer` (SQuAD: lowercase, no
    punctuation, no a/an/the, single spaces): metric "em": 1.0 iff the first `<answer>` content
    equals some alias, else 0.0; metric "f1" (default): the best `token_f1` over the aliases
    (1.0 on an exact match, and also on the same tokens in another order). No answer: 0.0.
    """

    metric: str = "f1"
    template: str = QA_TEMPLATE

    tfds_splits: ClassVar[dict[str, str]] = {"train": "train", "test": "validation"}

    def __post_init__(self):
        _check_template(self.name, self.template, {"question"}, {"question"})
        if self.metric not in QA_METRICS:
            raise ValueError(f"{self.name}: metric must be one of {tuple(QA_METRICS.names())}, "
                             f"got {self.metric!r}")

    def _aliases(self, record) -> list[str]:
        raise NotImplementedError

    def _to_example(self, record) -> Example:
        aliases = [a.strip() for a in self._aliases(record)]
        aliases = list(dict.fromkeys(a for a in aliases if a))
        if not aliases:
            raise ValueError("no answer")
        question = _text(record["question"]).strip()
        return Example(prompt=self.template.format(question=question), answer=aliases[0],
                       meta=tuple(aliases))

    def score(self, completion: str, ex: Example) -> float:
        return best_match(extract_answer(completion), ex.meta, QA_METRICS.get(self.metric))

    def feedback(self, completion: str, ex: Example) -> str:
        """"no answer" / "wrong" / "correct" / "partly right (F1 0.67)"."""
        s = self.score(completion, ex)
        if 0.0 < s < 1.0:
            return f"partly right (F1 {s:.2f})"
        return super().feedback(completion, ex)


@dataclasses.dataclass(frozen=True)
class TriviaQaTask(QaTask):
    """TriviaQA without context (TFDS `trivia_qa/{config}`, default `rc.nocontext`: `question`,
    `answer` {`value`, `aliases`, `normalized_aliases`}); the test split is TFDS's validation
    (TFDS's test has no answers). Canonical answer `value`; aliases value + aliases +
    normalized_aliases. Reward: SQuAD EM or F1 (see `QaTask`)."""

    name: ClassVar[str] = "trivia_qa"
    tfds_name: ClassVar[str] = "trivia_qa"
    record_fields: ClassVar[tuple[str, ...]] = ("question", "answer")
    config: str = "rc.nocontext"

    def _dataset(self) -> str:
        return f"{self.tfds_name}/{self.config}"

    def _aliases(self, record) -> list[str]:
        answer = record["answer"]
        return ([_text(answer["value"])] + _texts(answer["aliases"])
                + _texts(answer["normalized_aliases"]))


@dataclasses.dataclass(frozen=True)
class NqOpenTask(QaTask):
    """Natural Questions Open (TFDS `natural_questions_open`: `question`, `answer` a list of
    strings); the test split is TFDS's validation. Canonical answer: the first in the list.
    Reward: SQuAD EM or F1 (see `QaTask`)."""

    name: ClassVar[str] = "nq_open"
    tfds_name: ClassVar[str] = "natural_questions_open"
    record_fields: ClassVar[tuple[str, ...]] = ("question", "answer")

    def _aliases(self, record) -> list[str]:
        return _texts(record["answer"])


# ----------------------------------------------------------------------------- local JSONL


def _json_answers(value: Any, field: str) -> tuple[str, ...]:
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, str | int | float):
            raise ValueError(f"field '{field}' must be a string, a number or a non-empty list "
                             f"of them, got {json.dumps(value)[:60]}")
        out.append(item if isinstance(item, str) else json.dumps(item))
    if not out or not all(a.strip() for a in out):
        raise ValueError(f"field '{field}' must be non-empty, got {json.dumps(value)[:60]}")
    return tuple(a.strip() for a in out)


def _quoted(fields: Sequence[str]) -> str:
    names = [f"'{f}'" for f in fields]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def read_jsonl(path: str, fields: Sequence[str], what: str, row: Callable[[dict], Any]) -> list:
    """[row(record)] for every non-blank line of `path`, each a JSON object with `fields`;
    cached until the file changes. Errors are one line naming `what` file, the line and the
    field; `row` raises ValueError for its own checks (prefixed with "path:line: ")."""
    try:
        stat = os.stat(path)
    except OSError:
        raise FileNotFoundError(f"{what} file '{path}' does not exist") from None
    key = (what, os.path.abspath(path), stat.st_mtime_ns, stat.st_size, tuple(fields))
    if key in SOURCE_CACHE:
        return SOURCE_CACHE[key]
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{lineno}: invalid JSON ({err.msg} at column "
                                 f"{err.colno})") from None
            if not isinstance(rec, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object with fields "
                                 f"{_quoted(fields)}")
            for field in fields:
                if field not in rec:
                    raise ValueError(f"{path}:{lineno}: missing field '{field}' "
                                     f"(has {sorted(rec)[:10]})")
            try:
                rows.append(row(rec))
            except ValueError as err:
                raise ValueError(f"{path}:{lineno}: {err}") from None
    if not rows:
        raise ValueError(f"{what} file '{path}' has no records")
    SOURCE_CACHE[key] = rows
    return rows


def _read_jsonl(path: str, prompt_field: str, answer_field: str) -> list[tuple[str, tuple]]:
    """(prompt, answers) per non-blank line of `path`; cached until the file changes."""

    def row(rec: dict) -> tuple[str, tuple]:
        prompt = rec[prompt_field]
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(f"field '{prompt_field}' must be a non-empty string")
        return prompt, _json_answers(rec[answer_field], answer_field)

    return read_jsonl(path, (prompt_field, answer_field), "JSONL task", row)


def _jsonl_match(prediction: str | None, gold: str) -> float:
    """A numeric gold matches by value (`numeric_match`), any other after `normalize_text`."""
    if parse_number(gold) is not None:
        return numeric_match(prediction, gold)
    return string_match(prediction, gold, normalize=normalize_text)


@dataclasses.dataclass(frozen=True)
class JsonlTask(DatasetTask):
    """Your own problems: a local JSONL file, one {"prompt": ..., "answer": ...} object a line.

    `answer` is a string, a number or a non-empty list of them (any is accepted; the first is
    the SFT target); blank lines are skipped; field names are `prompt_field` / `answer_field`.
    The prompt is used verbatim (ask for the answer inside <answer></answer> in it). Splits:
    with `test_path`, train is all of `path` and test all of `test_path`; otherwise a record is
    "test" iff the stable hash of its prompt falls in the `test_fraction` bucket (the same
    prompt always lands in the same split). Meta: the accepted answers.

    Reward (`score`): 1.0 iff the first `<answer>` content matches some accepted answer, else
    0.0. An accepted answer that `parse_number` reads as a number matches a content of equal
    value ("1,234.0" matches 1234); any other matches a content equal to it after case-folding
    and collapsing whitespace.
    """

    name: ClassVar[str] = "jsonl"
    path: str = ""
    test_path: str | None = None
    test_fraction: float = 0.1
    prompt_field: str = "prompt"
    answer_field: str = "answer"

    def __post_init__(self):
        if not self.path:
            raise ValueError("jsonl: pass path=<a JSONL file with 'prompt' and 'answer' fields>")
        if not 0.0 <= self.test_fraction < 1.0:
            raise ValueError(f"jsonl: test_fraction must be in [0, 1), got {self.test_fraction}")

    def _records(self, split: str) -> Sequence[Any]:
        if self.test_path is not None:
            path = self.path if split == "train" else self.test_path
            return _read_jsonl(os.path.expanduser(path), self.prompt_field, self.answer_field)
        path = os.path.expanduser(self.path)
        key = ("jsonl_split", os.path.abspath(path), self.test_fraction, split,
               self.prompt_field, self.answer_field)
        rows = _read_jsonl(path, self.prompt_field, self.answer_field)
        cached = SOURCE_CACHE.get(key)
        if cached is None or cached[0] is not rows:  # (re)split when the file was re-read
            cut = round(self.test_fraction * _TEST_BUCKETS)
            part = [r for r in rows
                    if (stable_hash(r[0]) % _TEST_BUCKETS < cut) == (split == "test")]
            cached = SOURCE_CACHE[key] = (rows, part)
        return cached[1]

    def _where(self, split: str) -> str:
        path = self.test_path if split == "test" and self.test_path is not None else self.path
        return f"JSONL task file '{path}' split {split!r}"

    def _to_example(self, record) -> Example:
        prompt, answers = record
        return Example(prompt=prompt, answer=answers[0], meta=answers)

    def score(self, completion: str, ex: Example) -> float:
        return best_match(extract_answer(completion), ex.meta, _jsonl_match)


_ADAPTERS: tuple[type[DatasetTask], ...] = (
    Gsm8kTask, AgNewsTask, ImdbTask, TriviaQaTask, NqOpenTask, JsonlTask,
)
for _cls in _ADAPTERS:
    TASKS.register(_cls.name, _cls)

__all__ = [
    "CLASSIFY_TEMPLATE",
    "GSM8K_TEMPLATE",
    "QA_TEMPLATE",
    "AgNewsTask",
    "ClassificationTask",
    "DatasetTask",
    "Gsm8kTask",
    "ImdbTask",
    "JsonlTask",
    "NqOpenTask",
    "QaTask",
    "TfdsTask",
    "TriviaQaTask",
    "clear_dataset_cache",
    "exact_match",
    "gsm8k_final_answer",
    "normalize_answer",
    "parse_number",
    "token_f1",
]
