"""GRPO and SFT on your own prompts and reward functions, in a few lines (TRL's `GRPOTrainer`
shape), built on the LM kit: the records become a `Task`, and `algorithms.lm_study.LMStudy`
trains it with the same trainers, checkpoints, resume, mesh, progress bar and metrics.jsonl as
`jaxrl-suite run`.

    from jaxrl_suite import GRPO, LM

    def correct(prompt: str, completion: str, answer: str) -> float:
        return float(completion.strip() == answer)

    trainer = GRPO(model=LM.small(), reward_funcs=[correct],
                   train_prompts=[{"prompt": "47+85=", "answer": "132"}, ...],
                   config={"group_size": 8, "steps": 200})
    trainer.train()
    print(trainer.evaluate(test_prompts))  # greedy_accuracy, sampled_accuracy, mean_reward

Records are a list of dicts, a JSONL path (str or Path) or any iterable of dicts (a Hugging Face
`datasets.Dataset`). Every record has a "prompt"; SFT's training records a "completion" (its
target); any other field reaches the reward functions that name it. The "train" split of the
task is exactly the training records, walked in a seeded order reshuffled each epoch; the
"test" split is exactly the eval records. Nothing is held out of training and nothing is
dropped: a prompt longer than `prompt_len` (by default the longest prompt of the data) is a
one-line `ConfigError` at load, before anything trains, unless `truncate="left"` cuts it.

Reward: `reward(c) = sum_j w_j f_j(c)` over `reward_funcs` with `reward_weights` (`Rewards`);
each f_j is logged as its batch mean "reward_<name>". A completion is solved (accuracy,
pass@k) when its reward reaches `solved_reward` (default: the sum of the positive weights, i.e.
every function at 1). docs/api.md describes each option.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import math
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import jax
import numpy as np

from jaxrl_suite.algorithms.grpo_config import GRPOConfig
from jaxrl_suite.algorithms.lm_study import (
    EvalConfig,
    LMSections,
    LMStudy,
    RunConfig,
    TaskConfig,
    lm_keys,
)
from jaxrl_suite.algorithms.sft import SFTConfig
from jaxrl_suite.core.config import ConfigError, from_dict, to_dict
from jaxrl_suite.core.experiment import RunOptions
from jaxrl_suite.core.metrics import WandbOptions, read_metrics, wandb_options, write_json
from jaxrl_suite.core.parallel import print0
from jaxrl_suite.core.rundir import earlier_run, resume_changes
from jaxrl_suite.core.signals import stop_on_sigterm
from jaxrl_suite.envs.text.base import Example, ExampleList, Task, Verdicts
from jaxrl_suite.envs.text.tfds_tasks import read_jsonl
from jaxrl_suite.envs.text.tokenizer import Tokenizer, load_tokenizer
from jaxrl_suite.models.hf import OPTIONS, ModelConfig
from jaxrl_suite.models.lm import LMConfig
from jaxrl_suite.models.lora import init_lora, lora_config_of, split_lora

PROMPT, COMPLETION = "prompt", "completion"
REFERENCE = "reference"  # a record's "completion" (SFT's target), as reward functions see it
TRUNCATE = (None, "left")
# reward names whose "reward_<name>" metric the GRPO trainer logs itself
_RESERVED_NAMES = ("std", "var")
_FAILED = "_failed"  # "reward_<name>_failed": the share of completions whose <name> failed
# LM.small(): the experiments' from-scratch model (1.1M params, minutes on a 2-core CPU)
SMALL = {"vocab_size": 384, "d_model": 128, "n_layers": 4, "n_heads": 4, "n_kv_heads": 4,
         "d_ff": 512, "max_len": 512}

Records = Iterable[Mapping[str, Any]] | str | os.PathLike


# ---- models -----------------------------------------------------------------------------------
class LM:
    """A model to train: its config (the sizes of a from-scratch `CausalLM`, or a local Hugging
    Face checkpoint), its tokenizer and, optionally, its start params.

        LM.small()                                   # 4 x 128, byte tokenizer: minutes on CPU
        LM(d_model=64, n_layers=2, lora_rank=4)      # `ModelConfig` fields
        LM(ModelConfig(...))                         # or the config itself
        LM.from_pretrained("/models/Qwen2.5-0.5B", lora_rank=8)   # weights + tokenizer
        sft.model                                    # a trained model: its params and tokenizer

    `tokenizer`: "byt5" (bytes: any text, no files), "bpe:N" (a byte-level BPE of N ids trained
    on the training records' text), a local Hugging Face tokenizer directory, or a `Tokenizer`
    (a trained model's). A checkpoint brings its own. `params`: start params of the model's
    tree (None: a fresh init with the trainer's seed, or the checkpoint's weights); a LoRA
    model started from params without adapters gets fresh ones (B = 0).
    """

    def __init__(self, config: ModelConfig | LMConfig | None = None, *,
                 tokenizer: str | Tokenizer = "byt5", params: Any = None, **fields):
        if config is not None and fields:
            raise ConfigError(f"LM: pass a ModelConfig or its fields, not both "
                              f"(got {', '.join(fields)})")
        if config is None:
            config = from_dict(ModelConfig, fields, prefix="model.")
        elif not isinstance(config, ModelConfig):
            if not isinstance(config, LMConfig):
                raise ConfigError(f"LM: config must be a ModelConfig, got "
                                  f"{type(config).__name__}")
            config = ModelConfig(**{f.name: getattr(config, f.name)
                                    for f in dataclasses.fields(LMConfig)})
        if not isinstance(tokenizer, str | Tokenizer):
            raise ConfigError(f"LM: tokenizer must be a name, a directory or a Tokenizer, got "
                              f"{type(tokenizer).__name__}")
        self.config, self.tokenizer, self.params = config, tokenizer, params

    @classmethod
    def small(cls, *, tokenizer: str | Tokenizer = "byt5", params: Any = None, **fields) -> LM:
        """The experiments' small from-scratch model (`SMALL`: 4 layers of width 128, 1.1M
        params), with `fields` overriding its sizes; with a "bpe:N" tokenizer its vocabulary
        is N unless `vocab_size` is given."""
        base = dict(SMALL)
        if isinstance(tokenizer, str) and tokenizer.startswith("bpe:") and \
                tokenizer[4:].isdigit():
            base["vocab_size"] = int(tokenizer[4:])
        elif isinstance(tokenizer, Tokenizer):
            base["vocab_size"] = max(base["vocab_size"], tokenizer.vocab_size)
        return cls(tokenizer=tokenizer, params=params, **{**base, **fields})

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, **options) -> LM:
        """A local Hugging Face checkpoint directory (Llama, Qwen2, Qwen3 safetensors and its
        tokenizer; `models.hf`). `options`: the `ModelConfig` fields a checkpoint does not hold
        (dtype, param_dtype, remat, scan_layers, attention_impl) and LoRA (lora_rank,
        lora_alpha, lora_targets)."""
        allowed = (*OPTIONS, "lora_rank", "lora_alpha", "lora_targets")
        for k in options:
            if k not in allowed:
                raise ConfigError(f"LM.from_pretrained: {k!r} comes from the checkpoint; the "
                                  f"options are {', '.join(allowed)}")
        return cls(hf_path=os.fspath(path), **options)

    def with_lora(self, rank: int = 8, alpha: float = 16.0,
                  targets: Sequence[str] | None = None) -> LM:
        """This model with LoRA adapters (`models.lora`) of `rank` on `targets` (default: every
        projection): the trainers then train the adapters alone."""
        fields = {"lora_rank": rank, "lora_alpha": alpha}
        if targets is not None:
            fields["lora_targets"] = list(targets)
        config = from_dict(ModelConfig, {**to_dict(self.config), **fields}, prefix="model.")
        return LM(config, tokenizer=self.tokenizer, params=self.params)

    @property
    def pretrained(self) -> bool:
        """Whether the model is a Hugging Face checkpoint (`from_pretrained`)."""
        return self.config.hf_path is not None

    def load_tokenizer(self, texts: Sequence[str]) -> Tokenizer:
        """The tokenizer (a "bpe:N" one trained on `texts`); one-line ConfigError if none."""
        if isinstance(self.tokenizer, Tokenizer):
            return self.tokenizer
        spec = self.config.hf_path or self.tokenizer
        try:
            return load_tokenizer(spec, texts=list(texts) if spec.startswith("bpe:") else None)
        except (ValueError, FileNotFoundError) as e:
            where = "LM.from_pretrained" if self.pretrained else "LM tokenizer"
            raise ConfigError(f"{where}: {e}") from None

    def __repr__(self) -> str:
        c = self.config
        what = (f"hf_path={c.hf_path!r}" if c.hf_path else
                f"d_model={c.d_model}, n_layers={c.n_layers}, vocab_size={c.vocab_size}")
        lora = f", lora_rank={c.lora_rank}" if c.lora_rank else ""
        tok = self.tokenizer if isinstance(self.tokenizer, str) else "<Tokenizer>"
        params = ", params=<given>" if self.params is not None else ""
        return f"LM({what}{lora}, tokenizer={tok!r}{params})"


# ---- records ----------------------------------------------------------------------------------
def read_records(data: Records, what: str) -> list[dict]:
    """The records of `data`: a JSONL path (one object a line; blank lines skipped), or an
    iterable of mappings (a list of dicts, a `datasets.Dataset`). One-line ConfigErrors."""
    if isinstance(data, str | os.PathLike):
        return _read_jsonl(Path(data).expanduser(), what)
    if isinstance(data, Mapping):
        raise ConfigError(f"{what}: got one mapping; pass a list of records (dicts), a JSONL "
                          f"path or an iterable of records")
    try:
        records = list(data)
    except TypeError:
        raise ConfigError(f"{what}: expected a list of dicts, a JSONL path or an iterable of "
                          f"records, got {type(data).__name__}") from None
    for i, r in enumerate(records):
        if not isinstance(r, Mapping):
            raise ConfigError(f"{what} record {i} is a {type(r).__name__}, not a mapping of "
                              f"fields (e.g. {{'prompt': ...}})")
    if not records:
        raise ConfigError(f"{what}: no records")
    return [dict(r) for r in records]


def _read_jsonl(path: Path, what: str) -> list[dict]:
    """The records of a JSONL file, read by the kit's `read_jsonl` (fields are checked after);
    its one-line errors become ConfigErrors."""
    try:
        return read_jsonl(str(path), (), what, dict)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{what}: {e}") from None


def check_records(records: Sequence[Mapping], what: str, required: Mapping[str, str]) -> None:
    """Every record has a string "prompt" and each `required` field (field -> who needs it);
    the first that does not is a one-line ConfigError naming its index and the field."""
    for i, r in enumerate(records):
        for field in (PROMPT, *required):
            if field not in r:
                why = required.get(field, "every record needs one")
                raise ConfigError(f"{what} record {i} has no field {field!r} ({why})")
        if not isinstance(r[PROMPT], str):
            raise ConfigError(f"{what} record {i}: field 'prompt' must be a string, got "
                              f"{type(r[PROMPT]).__name__}")
        if COMPLETION in r and REFERENCE in r:
            raise ConfigError(f"{what} record {i} has both 'completion' and 'reference' (a "
                              f"record's 'completion' reaches reward functions as 'reference')")


def to_example(record: Mapping[str, Any]) -> Example:
    """An `Example` of a record: its prompt, its "answer" as a string ("" if none) and every
    other field in `meta` as (name, value) pairs, "completion" renamed "reference"."""
    fields = {(REFERENCE if k == COMPLETION else k): v for k, v in record.items() if k != PROMPT}
    answer = fields.get("answer", "")
    return Example(prompt=record[PROMPT], answer=answer if isinstance(answer, str) else
                   str(answer), meta=tuple(fields.items()))


def truncate_left(text: str, tokenizer: Tokenizer, n: int) -> str:
    """The end of `text` that fits `n` tokens (its last n tokens, decoded; cut by a character
    more while re-encoding them needs more)."""
    ids = tokenizer.encode(text)
    if len(ids) <= n:
        return text
    out = tokenizer.decode(ids[-n:])
    while out and len(tokenizer.encode(out)) > n:
        out = out[1:]
    return out


def fit_prompts(examples: Sequence[Example], tokenizer: Tokenizer, prompt_len: int,
                truncate: str | None, what: str) -> list[Example]:
    """`examples` whose prompts fit `prompt_len` tokens: as they are, else (truncate="left")
    cut from the left, said in one line; without truncation a prompt too long is one
    ConfigError line with their count and the longest length."""
    lengths = [len(tokenizer.encode(e.prompt)) for e in examples]
    if 0 in lengths:
        i = lengths.index(0)
        raise ConfigError(f"{what} record {i}: its prompt {examples[i].prompt!r:.40} has no "
                          f"tokens ({lengths.count(0)} such prompts)")
    long = [n for n in lengths if n > prompt_len]
    if not long:
        return list(examples)
    if truncate is None:
        raise ConfigError(f"{what}: {len(long)} of {len(examples)} prompts do not fit "
                          f"prompt_len={prompt_len} tokens (the longest has {max(long)}); pass "
                          f"a larger prompt_len, or truncate='left' to cut them from the left")
    print0(f"jaxrl_suite: {what}: {len(long)} of {len(examples)} prompts cut from the left to "
           f"prompt_len={prompt_len} tokens (the longest had {max(long)})")
    return [dataclasses.replace(e, prompt=truncate_left(e.prompt, tokenizer, prompt_len))
            if n > prompt_len else e for e, n in zip(examples, lengths, strict=True)]


# ---- rewards ----------------------------------------------------------------------------------
def exact_completion(completion: str, reference: str) -> float:
    """1.0 iff the completion equals the record's "completion" (whitespace at the ends aside):
    SFT's default reward, for its evaluation."""
    return float(completion.strip() == reference.strip())


def _func_name(f: Callable, i: int) -> str:
    name = getattr(getattr(f, "func", f), "__name__", None) or type(f).__name__
    return name if name.isidentifier() else f"reward{i}"  # a lambda: its index


class Rewards:
    """Weighted reward functions on decoded completions: reward(c) = sum_j w_j f_j(c).

    Each f_j is called once per completion with keyword arguments: those of its signature among
    `prompt`, `completion` (the generated text) and the record's fields (a record's own
    "completion" as `reference`); a `**kwargs` takes them all. A parameter without a default
    that is none of these is a field every record must have (one-line ConfigError at load).

    A function that raises (any `Exception`) or returns something that is not a finite number
    gives 0 for that completion; the share of such completions is logged as
    "reward_<name>_failed" and the first failure of each function is printed (once). A
    `KeyboardInterrupt` is not caught.

    `solved`: the reward at or above which a completion counts as solved (accuracy, pass@k);
    default the sum of the positive weights (every function at 1).
    """

    def __init__(self, funcs: Callable | Sequence[Callable] | Mapping[str, Callable],
                 weights: Sequence[float] | None = None, *, solved: float | None = None):
        if callable(funcs):
            funcs = [funcs]
        if isinstance(funcs, str) or not isinstance(funcs, Iterable):
            raise ConfigError(f"reward_funcs: expected a function, a list of them or a dict "
                              f"{{name: function}}, got {type(funcs).__name__}")
        items = list(funcs.items()) if isinstance(funcs, Mapping) else \
            [(None, f) for f in funcs]
        if not items:
            raise ConfigError("reward_funcs: give at least one reward function")
        names = []
        for i, (name, f) in enumerate(items):
            if not callable(f):
                raise ConfigError(f"reward_funcs[{i}] is a {type(f).__name__}, not a function")
            names.append(name or _func_name(f, i))
        for name in names:
            if names.count(name) > 1:
                raise ConfigError(f"reward_funcs: two functions are named {name!r}; name them "
                                  f"with a dict, reward_funcs={{'a': f, 'b': g}}")
            if name in _RESERVED_NAMES or name.endswith(_FAILED):
                raise ConfigError(f"reward_funcs: the name {name!r} is reserved (the metrics "
                                  f"reward_std, reward_var and reward_<name>{_FAILED}); rename it")
        weights = [1.0] * len(items) if weights is None else list(weights)
        if len(weights) != len(items):
            raise ConfigError(f"reward_weights has {len(weights)} weights for {len(items)} "
                              f"reward functions")
        try:
            weights = [float(w) for w in weights]
        except (TypeError, ValueError):
            raise ConfigError(f"reward_weights must be numbers, got {weights}") from None
        if not all(math.isfinite(w) for w in weights):
            raise ConfigError(f"reward_weights must be finite, got {weights}")
        self.names, self.funcs = names, [f for _, f in items]
        self.weights = np.asarray(weights, np.float64)  # [F]
        self.solved = float(self.weights[self.weights > 0].sum()) if solved is None else solved
        if not math.isfinite(self.solved):
            raise ConfigError(f"solved_reward must be finite, got {solved}")
        self._params = [_parameters(f, n) for f, n in zip(self.funcs, names, strict=True)]
        self._warned: set[str] = set()

    def required_fields(self) -> dict[str, str]:
        """{record field: who needs it} of the functions' parameters without defaults."""
        out: dict[str, str] = {}
        for name, (_, required, _) in zip(self.names, self._params, strict=True):
            for p in required:
                if p not in (PROMPT, COMPLETION):
                    field = COMPLETION if p == REFERENCE else p
                    out.setdefault(field, f"reward function {name!r} takes {p!r}")
        return out

    def _call(self, j: int, kwargs: dict) -> tuple[float, float]:
        """(value, failed) of function j on one completion's arguments."""
        named, _, takes_all = self._params[j]
        args = kwargs if takes_all else {k: v for k, v in kwargs.items() if k in named}
        try:
            out = self.funcs[j](**args)
        except Exception as e:  # noqa: BLE001 - a user's function: any error counts as a failure
            return self._fail(j, f"raised {type(e).__name__}: {e}", kwargs)
        try:
            value = float(out)
        except (TypeError, ValueError):
            return self._fail(j, f"returned {out!r:.40}, not a number", kwargs)
        if not math.isfinite(value):
            return self._fail(j, f"returned {value}", kwargs)
        return value, 0.0

    def _fail(self, j: int, what: str, kwargs: dict) -> tuple[float, float]:
        name = self.names[j]
        if name not in self._warned:
            self._warned.add(name)
            print0(f"WARNING: reward function {name!r} {what} (prompt {kwargs[PROMPT]!r:.60}); "
                   f"such a completion gets 0 from it, counted in reward_{name}{_FAILED} "
                   f"(said once)")
        return 0.0, 1.0

    def verify(self, completions: Sequence[str], examples: Sequence[Example]) -> Verdicts:
        """The batch's `Verdicts`: rewards (the weighted sum), components (each function's
        values, and its failures as <name>_failed) and scores (1.0 iff solved)."""
        if len(completions) != len(examples):
            raise ValueError(f"{len(completions)} completions for {len(examples)} examples")
        out = np.zeros((2, len(self.funcs), len(completions)))  # [value | failed, F, B]
        for i, (c, ex) in enumerate(zip(completions, examples, strict=True)):
            kwargs = {**dict(ex.meta), PROMPT: ex.prompt, COMPLETION: c}
            for j in range(len(self.funcs)):
                out[:, j, i] = self._call(j, kwargs)
        rewards = self.weights @ out[0]  # [B]
        solved = (rewards >= self.solved) | np.isclose(rewards, self.solved)
        components = {}
        for j, name in enumerate(self.names):
            components[name] = out[0, j].tolist()
            components[name + _FAILED] = out[1, j].tolist()
        return Verdicts(scores=solved.astype(np.float64).tolist(), rewards=rewards.tolist(),
                        components=components)


def _parameters(f: Callable, name: str) -> tuple[set[str], list[str], bool]:
    """(named keyword parameters, those without a default, takes **kwargs) of a function."""
    try:
        sig = inspect.signature(f)
    except (TypeError, ValueError):
        raise ConfigError(f"reward function {name!r}: its signature cannot be read; wrap it "
                          f"in a def") from None
    named, required, takes_all = set(), [], False
    for p in sig.parameters.values():
        if p.kind is p.VAR_KEYWORD:
            takes_all = True
        elif p.kind is p.POSITIONAL_ONLY and p.default is p.empty:
            raise ConfigError(f"reward function {name!r}: parameter {p.name!r} is positional-"
                              f"only; reward functions are called with keywords")
        elif p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            named.add(p.name)
            if p.default is p.empty:
                required.append(p.name)
    return named, required, takes_all


@dataclasses.dataclass(frozen=True, eq=False)
class RewardTask(Task):
    """The verifier of a `RecordsTask`: `Rewards` on the records' fields. Its solution (SFT's
    target) is a record's "completion" when `targets`, else "" (GRPO needs none)."""

    name: ClassVar[str] = "rewards"
    rewards: Rewards
    targets: bool = True
    seed: int = 0

    def _generate(self, rng):
        raise NotImplementedError("RewardTask scores records; RecordsTask serves them")

    def solution(self, ex: Example) -> str:
        return str(dict(ex.meta).get(REFERENCE, "")) if self.targets else ""

    def score(self, completion: str, ex: Example) -> float:
        return self.verify_batch([completion], [ex]).scores[0]

    def verify_batch(self, completions: Sequence[str], examples: Sequence[Example]) -> Verdicts:
        return self.rewards.verify(completions, examples)


@dataclasses.dataclass(frozen=True, eq=False)
class RecordsTask(ExampleList):
    """A user's records as a task: "train" is exactly `train` in a seeded order reshuffled each
    epoch (`ExampleList`), "test" exactly `test` in order (a finite split: `examples("test",
    ...)` ends with it), verified by `base` (a `RewardTask`)."""

    name: ClassVar[str] = "records"
    test: tuple[Example, ...] = ()

    def example(self, split: str, index: int) -> Example:
        if split != "test":
            return super().example(split, index)
        if not 0 <= index < len(self.test):
            raise ValueError(f"the test split has {len(self.test)} records; no record {index}")
        return self.test[index]

    def examples(self, split: str, start: int, n: int) -> list[Example]:
        if split == "test":
            return list(self.test[start : start + n])
        return super().examples(split, start, n)


# ---- trainers ---------------------------------------------------------------------------------
def _section(cls, value, prefix: str, *, defaults: Mapping[str, Any] | None = None,
             fixed: Mapping[str, Any] | None = None, refused: Mapping[str, str] | None = None):
    """A kit config section from a dict of its fields (checked: an unknown key or a bad value
    is one ConfigError line naming it) or the section itself; `defaults` fill the fields the
    dict leaves out, `fixed` are the trainer's and `refused` (field -> where it comes from)
    may not be given."""
    fixed, refused = dict(fixed or {}), dict(refused or {})
    if isinstance(value, cls):
        return dataclasses.replace(value, **{k: tuple(v) if isinstance(v, list) else v
                                             for k, v in fixed.items()})
    value = dict(value or {})
    for k, source in refused.items():
        if k in value:
            raise ConfigError(f"config field '{prefix}{k}' is set by the trainer ({source})")
    return from_dict(cls, {**(defaults or {}), **value, **fixed}, prefix=prefix)


def _digest(records: Sequence[Mapping] | None) -> str | None:
    if records is None:
        return None
    text = json.dumps(records, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _chain(*callbacks):
    """One `fit` callback of several (None where none)."""
    callbacks = [c for c in callbacks if c is not None]
    if not callbacks:
        return None
    return lambda n, state: {k: v for c in callbacks for k, v in c(n, state).items()}


COMMON_OPTIONS = ("prompt_len", "truncate", "seed", "eval_config", "run_config", "out_dir",
                  "resume", "progress", "tensorboard", "wandb")


def _check_options(who: str, options: Mapping[str, Any]) -> None:
    """A keyword that is not one of COMMON_OPTIONS is a one-line ConfigError."""
    unknown = sorted(set(options) - set(COMMON_OPTIONS))
    if unknown:
        raise ConfigError(f"{who}() got an unknown option {unknown[0]!r}; its other options: "
                          f"{', '.join(COMMON_OPTIONS)}")


class _Trainer:
    """What GRPO and SFT share: records -> task, tokenizer, lengths, the `LMStudy`, the output
    directory, resume, evaluation.

    The options both take (`COMMON_OPTIONS`, keyword only):
      prompt_len: prompt tokens (default: the longest prompt of the records).
      truncate: None (a prompt too long is an error) or "left" (cut from the left).
      seed: model init, data order and sampling.
      eval_config: `EvalConfig` fields ("every", "batch_size", "samples", "ks", ...).
      run_config: `RunConfig` fields ("checkpoint_every", "keep_checkpoints", "num_devices",
        "mesh": {"data", "fsdp", "tensor"}).
      out_dir: metrics.jsonl, config.json and checkpoints/STAGE (default: a new temporary
        directory); resume: continue the run in out_dir; progress: the progress bar;
        tensorboard: also TensorBoard event files; wandb: also log to Weights & Biases (True,
        or a dict of "project", "entity", "mode"; the `wandb` extra).
    """

    stage: ClassVar[str]  # "grpo" | "sft": the stage name in metrics.jsonl and checkpoints/

    def __init__(self, model: LM | None, train: Records, eval_records: Records | None,
                 rewards: Rewards, *, names: tuple[str, str], grpo: GRPOConfig, sft: SFTConfig,
                 targets: bool, max_new_tokens: int | None = None,
                 prompt_len: int | None = None, truncate: str | None = None, seed: int = 0,
                 eval_config: Mapping[str, Any] | EvalConfig | None = None,
                 run_config: Mapping[str, Any] | RunConfig | None = None,
                 out_dir: str | os.PathLike | None = None, resume: bool = False,
                 progress: bool = True, tensorboard: bool = False,
                 wandb: bool | Mapping[str, Any] | None = None):
        lm = LM.small() if model is None else model
        if not isinstance(lm, LM):
            raise ConfigError(f"model must be an LM (LM.small(), LM(...), "
                              f"LM.from_pretrained(path)), got {type(lm).__name__}")
        if truncate not in TRUNCATE:
            raise ConfigError(f"truncate must be None or 'left', got {truncate!r}")
        self.lm, self.rewards, self.truncate, self.seed = lm, rewards, truncate, seed
        self._names = names
        need = rewards.required_fields()
        train_records = read_records(train, names[0])
        check_records(train_records, names[0],
                      {**need, **({COMPLETION: "the SFT target"} if targets else {})})
        for i, r in enumerate(train_records if targets else ()):
            if not isinstance(r[COMPLETION], str):
                raise ConfigError(f"{names[0]} record {i}: field 'completion' must be a "
                                  f"string, got {type(r[COMPLETION]).__name__}")
        eval_list = None if eval_records is None else read_records(eval_records, names[1])
        if eval_list is not None:
            check_records(eval_list, names[1], need)
        tokenizer = lm.load_tokenizer([r[PROMPT] + r[COMPLETION] if isinstance(
            r.get(COMPLETION), str) else r[PROMPT] for r in train_records])
        train_ex = [to_example(r) for r in train_records]
        test_ex = [] if eval_list is None else [to_example(r) for r in eval_list]
        if prompt_len is None:
            prompt_len = max(len(tokenizer.encode(e.prompt)) for e in train_ex + test_ex)
        self.tokenizer, self.prompt_len = tokenizer, prompt_len
        train_ex = fit_prompts(train_ex, tokenizer, prompt_len, truncate, names[0])
        test_ex = fit_prompts(test_ex, tokenizer, prompt_len, truncate, names[1])
        if targets:  # SFT: each target and its EOS fit max_new_tokens
            lengths = [len(tokenizer.encode(r[COMPLETION])) + 1 for r in train_records]
            if max_new_tokens is None:
                max_new_tokens = max(lengths)
            long = [n for n in lengths if n > max_new_tokens]
            if long:
                raise ConfigError(f"{names[0]}: {len(long)} of {len(lengths)} completions do "
                                  f"not fit max_new_tokens={max_new_tokens} tokens with their "
                                  f"EOS (the longest needs {max(long)})")
            grpo = dataclasses.replace(grpo, max_new_tokens=max_new_tokens)
        task = RecordsTask(base=RewardTask(rewards, targets=targets, seed=seed),
                           train=tuple(train_ex), seed=seed, test=tuple(test_ex))
        try:
            task_cfg = TaskConfig(name=task.name, prompt_len=prompt_len, seed=seed)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        eval_cfg = _section(EvalConfig, eval_config, "eval.",
                            defaults={"num_examples": max(1, len(test_ex))})
        if eval_cfg.every and not test_ex:
            raise ConfigError(f"config field 'eval.every' needs eval records ({names[1]}=)")
        tok_name = lm.tokenizer if isinstance(lm.tokenizer, str) else "<given>"
        run_cfg = _section(RunConfig, run_config, "run.",
                           refused={"seeds": "pass seed=", "tokenizer": "the LM's"},
                           fixed={"seeds": [seed], "tokenizer": tok_name})
        self.cfg = LMSections(task=task_cfg, model=lm.config, sft=sft, grpo=grpo,
                              eval=eval_cfg, run=run_cfg)
        self.out_dir = self._out_dir(out_dir, resume)
        self._record = {
            "experiment": f"api.{self.stage}", "config": to_dict(self.cfg),
            "data": {"train": _digest(train_records), "eval": _digest(eval_list),
                     "truncate": truncate},
            "rewards": dict(zip(rewards.names, rewards.weights.tolist(), strict=True)),
            "solved_reward": rewards.solved,
            "start": "params" if lm.params is not None else "init"}
        if resume:
            self._check_resume()
        self.study = LMStudy(f"api_{self.stage}", self.cfg,
                             RunOptions(out_dir=self.out_dir, resume=resume,
                                        tensorboard=tensorboard, progress=progress,
                                        wandb=self._wandb(wandb)),
                             variants=(self.stage,), task=task, write_config=False,
                             tokenizer=tokenizer)
        model_cfg = self.study.lm.model.config
        if prompt_len + grpo.max_new_tokens > model_cfg.max_len:
            raise ConfigError(f"prompt_len={prompt_len} + max_new_tokens={grpo.max_new_tokens} "
                              f"tokens exceed the model's max_len={model_cfg.max_len}")
        self._start = self._start_params()
        self._state = None
        self._trainer = None

    # ---- set-up ----
    def _out_dir(self, out_dir, resume: bool) -> Path:
        """The output directory: `out_dir`, or a fresh temporary one. A fresh run refuses a
        directory that holds an earlier run (as `jaxrl-suite run` does without --resume)."""
        if out_dir is None:
            if resume:
                raise ConfigError("resume=True needs out_dir= (the run to continue)")
            if jax.process_count() > 1:
                raise ConfigError("a multi-process job needs out_dir= (one shared directory)")
            return Path(tempfile.mkdtemp(prefix=f"jaxrl_suite_{self.stage}_"))
        out_dir = Path(out_dir).expanduser()
        if not resume and earlier_run(out_dir):
            raise ConfigError(f"out_dir {out_dir} holds an earlier run: continue it with "
                              f"resume=True, or pass another out_dir")
        return out_dir

    def _check_resume(self) -> None:
        """A resumed run has the data, rewards and config of the run in out_dir (its
        config.json), save for the fields `jaxrl-suite run --resume` lets change
        (`core.rundir.RESUME_MAY_CHANGE`)."""
        if not earlier_run(self.out_dir):
            print0(f"jaxrl_suite: resume: nothing to resume in {self.out_dir}; starting afresh")
        resume_changes(self.out_dir, self._record, what="resume",
                       hint="resume with the same records, rewards and config, or pass another "
                       "out_dir", config_cls=LMSections)

    def _wandb(self, wandb: bool | Mapping[str, Any] | None) -> WandbOptions | None:
        """W&B logging (as `jaxrl-suite run --wandb`): on with wandb=True, a dict of
        {"project", "entity", "mode"}, or run_config={"wandb": {"enabled": True, ...}}; the
        dict's fields over run_config's. The W&B run's group is out_dir's name."""
        if wandb is not None and not isinstance(wandb, bool | Mapping):
            raise ConfigError(f"wandb must be True, False, None or a dict of project, entity, "
                              f"mode; got {type(wandb).__name__}")
        given = wandb if isinstance(wandb, Mapping) else {}
        unknown = sorted(set(given) - {"project", "entity", "mode"})
        if unknown:
            raise ConfigError(f"unknown wandb option {unknown[0]!r} (project, entity, mode)")
        on = wandb is True or isinstance(wandb, Mapping)
        return wandb_options(self.cfg.run.wandb, enabled=on, **given, group=self.out_dir.name,
                             job_type=f"api.{self.stage}", config=self._record)

    def _start_params(self):
        """The params training starts from: the LM's (with fresh adapters for a LoRA model
        whose params have none), else the study's initial ones. Checked against the model."""
        fresh = self.study.lm.params
        params = self.lm.params
        if params is None:
            return fresh
        model = self.study.lm.model
        if lora_config_of(model) is not None and not split_lora(params)[1]:
            params = init_lora(model, params, lm_keys(self.seed).init)
        shapes = jax.tree.map(np.shape, params)
        if shapes != jax.tree.map(np.shape, fresh):
            raise ConfigError("LM params do not match its config (another model's params?)")
        return params

    def _write_config(self) -> None:
        if jax.process_index() == 0:
            write_json(self.out_dir / "config.json", self._record)

    # ---- results ----
    @property
    def trainer(self):
        """The kit trainer (`GRPOTrainer` / `SFTTrainer`) on the study's model; built once."""
        if self._trainer is None:
            self._trainer = self._make_trainer()
        return self._trainer

    @property
    def params(self):
        """The trained params (the start params before `train`)."""
        return self._start if self._state is None else self._state.params

    @property
    def model(self) -> LM:
        """The model as trained so far: its config, tokenizer and params, e.g. the start of a
        GRPO run after SFT (`GRPO(model=sft.model, ...)`)."""
        return LM(self.lm.config, tokenizer=self.study.lm.tokenizer, params=self.params)

    @property
    def metrics(self) -> list[dict]:
        """The records of out_dir/metrics.jsonl, one per step (process 0 writes it)."""
        path = self.out_dir / "metrics.jsonl"
        return read_metrics(path) if path.is_file() else []

    def examples(self, records: Records, what: str = "evaluate") -> list[Example]:
        """`records` as examples of this trainer's task: fields checked, prompts fitted to its
        prompt_len (`truncate`)."""
        records = read_records(records, what)
        check_records(records, what, self.rewards.required_fields())
        return fit_prompts([to_example(r) for r in records], self.tokenizer, self.prompt_len,
                           self.truncate, what)

    def evaluate(self, records: Records | None = None) -> dict:
        """Greedy and sampled evaluation of the current params on `records` (default: the eval
        records given at construction), through `LMStudy.evaluate`: "greedy_accuracy" (the
        share of greedy completions that are solved), "sampled_accuracy" (pass@1 of one sample
        per prompt at the training temperature), "mean_reward" (of the greedy completions),
        "examples"; plus pass@k / maj@k with eval_config={"samples": n, "ks": [...]}."""
        if records is None:
            examples = self.study.held_out
            if not examples:
                raise ConfigError(f"evaluate: no eval records; pass evaluate(records), or "
                                  f"{self._names[1]}= at construction")
        else:
            examples = self.examples(records)
        out = self.study.evaluate(self.trainer, self.params, examples, reward=True)
        return {**out, "examples": len(examples)}

    def train(self):
        """Train for the configured steps (resumed from out_dir's latest checkpoint with
        resume=True); logs out_dir/metrics.jsonl, checkpoints out_dir/checkpoints/STAGE.
        Returns self; a second call does nothing."""
        if self._state is not None:
            return self
        self._write_config()
        ckpt = self.out_dir / "checkpoints" / self.stage
        trainer, study = self.trainer, self.study
        init, steps, callback, postfix = self._stage(trainer)
        callback = _chain(callback, study.periodic_eval(trainer, steps)
                          if self.cfg.eval.every else None)
        with stop_on_sigterm(enabled=jax.process_count() == 1), \
                study.log(self.out_dir, [(ckpt, 0)]) as logger:
            self._state = study.fit(trainer, init, stage=self.stage, num_steps=steps,
                                    checkpoint_dir=ckpt, logger=logger, postfix=postfix,
                                    callback=callback)
        return self

    def _make_trainer(self):
        raise NotImplementedError

    def _stage(self, trainer) -> tuple[Any, int, Callable | None, tuple[str, ...]]:
        """(initial state, steps, callback, progress-bar postfix) of the training stage."""
        raise NotImplementedError


class GRPO(_Trainer):
    """GRPO on your prompts and reward functions (`algorithms.grpo.GRPOTrainer` in an
    `LMStudy`). See the module docstring and docs/api.md.

    Args:
      model: an `LM` (default `LM.small()`); a trained one (`SFT(...).model`) starts GRPO from
        its params and tokenizer.
      reward_funcs: a function, a list of them or a dict {name: function} (`Rewards`).
      train_prompts / eval_prompts: records (a list of dicts, a JSONL path, an iterable of
        dicts) with "prompt" and the fields the reward functions take (e.g. "answer").
      reward_weights: one weight per function (default all 1).
      config: a dict of `GRPOConfig` fields ("steps", "group_size", "lr", ...) or a
        `GRPOConfig`; default the kit's defaults. An unknown key is a one-line ConfigError.
      solved_reward: the reward at which a completion counts as solved (default: the sum of the
        positive weights).
      **options: the options both trainers take (`COMMON_OPTIONS`): prompt_len, truncate, seed,
        eval_config, run_config, out_dir, resume, progress, tensorboard, wandb.
    """

    stage = "grpo"

    def __init__(self, model: LM | None = None, *, reward_funcs, train_prompts: Records,
                 eval_prompts: Records | None = None, reward_weights: Sequence[float] | None = None,
                 config: Mapping[str, Any] | GRPOConfig | None = None,
                 solved_reward: float | None = None, **options):
        if "max_new_tokens" in options:
            raise ConfigError("GRPO takes max_new_tokens in config= (grpo.max_new_tokens)")
        _check_options("GRPO", options)
        grpo = _section(GRPOConfig, config, "grpo.")
        if grpo.carry_optimizer:
            raise ConfigError("config field 'grpo.carry_optimizer' does not apply to the Python "
                              "API (the start carries no optimizer state)")
        if grpo.format_weight:
            raise ConfigError("config field 'grpo.format_weight' does not apply to reward "
                              "functions: add the format reward as one "
                              "(jaxrl_suite.rewards.format_reward)")
        super().__init__(model, train_prompts, eval_prompts,
                         Rewards(reward_funcs, reward_weights, solved=solved_reward),
                         names=("train_prompts", "eval_prompts"), grpo=grpo, sft=SFTConfig(),
                         targets=False, **options)

    def _make_trainer(self):
        c = self.cfg.grpo
        return self.study.grpo_trainer(c, ref_params=self._start if c.beta > 0 else None)

    def _stage(self, trainer):
        init = trainer.init_state(self._start, lm_keys(self.seed).grpo)
        return init, self.cfg.grpo.steps, None, ("reward", "accuracy")


class SFT(_Trainer):
    """Supervised fine-tuning on {"prompt", "completion"} records (`algorithms.sft.SFTTrainer`
    in an `LMStudy`): teacher forcing on completion + EOS. Its `model` can start a `GRPO`.

    Args as `GRPO`'s, except:
      train_data / eval_data: records with "prompt" and "completion" (eval records need the
        fields of the reward functions: the default one needs "completion").
      config: a dict of `SFTConfig` fields ("steps", "batch_size", "lr", "stop_accuracy", ...)
        or an `SFTConfig`.
      max_new_tokens: the completion budget of training and evaluation (default: the longest
        training completion with its EOS).
      reward_funcs: how `evaluate` scores a completion (default `exact_completion`: equal to
        the record's "completion").
    """

    stage = "sft"

    def __init__(self, model: LM | None = None, *, train_data: Records,
                 eval_data: Records | None = None,
                 config: Mapping[str, Any] | SFTConfig | None = None,
                 max_new_tokens: int | None = None, reward_funcs=None,
                 reward_weights: Sequence[float] | None = None,
                 solved_reward: float | None = None, **options):
        _check_options("SFT", options)
        sft = _section(SFTConfig, config, "sft.")
        rewards = Rewards({"exact": exact_completion} if reward_funcs is None else reward_funcs,
                          reward_weights, solved=solved_reward)
        if max_new_tokens is not None and (not isinstance(max_new_tokens, int) or
                                           max_new_tokens < 1):
            raise ConfigError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
        super().__init__(model, train_data, eval_data, rewards,
                         names=("train_data", "eval_data"), grpo=GRPOConfig(), sft=sft,
                         targets=True, max_new_tokens=max_new_tokens, **options)

    def _make_trainer(self):
        return self.study.sft_trainer()

    def _stage(self, trainer):
        init = trainer.init_state(self._start, lm_keys(self.seed).sft)
        return init, self.cfg.sft.steps, self.study.early_stop(trainer), ("loss",)


__all__ = ["GRPO", "LM", "SFT", "RecordsTask", "RewardTask", "Rewards", "exact_completion",
           "read_records"]
