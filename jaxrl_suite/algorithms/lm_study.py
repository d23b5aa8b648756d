"""The kit every LM experiment is built from: shared config sections, `build_lm`, and `LMStudy`.

An LM experiment is a `Config` of these sections, a dict of variants and a result table:

    @dataclasses.dataclass(frozen=True)
    class Config:
        task: TaskConfig = TaskConfig(name="countdown", prompt_len=14)
        model: ModelConfig = ModelConfig()
        sft: SFTConfig = SFTConfig()
        grpo: GRPOConfig = GRPOConfig()
        eval: EvalConfig = EvalConfig()
        run: RunConfig = RunConfig(seeds=(0, 1, 2))

    def run(cfg, opts):
        study = LMStudy(NAME, cfg, opts, variants=("plain", "gspo"))
        sft = study.shared_sft()                          # one SFT checkpoint for every run
        def train(variant, seed, sft):
            config = dataclasses.replace(cfg.grpo, policy_loss=variant)
            trainer = study.grpo_trainer(config, ref_params=sft.params)
            state = study.fit_run(trainer, trainer.init_state(sft.params, study.grpo_key(seed)),
                                  variant, seed, num_steps=config.steps)
            return study.evaluate(trainer, state.params)
        results = study.run(train, sft)                   # {run name: result}, resumable
        stats = study.aggregate(results, ["greedy_accuracy", "sampled_accuracy"])
        return study.finish({"variants": stats}, study.table(stats, ["greedy_accuracy"]))

Every LM experiment takes every registered task (`task.name`, built through `envs.text.TASKS`,
gsm8k and jsonl included) and a local Hugging Face checkpoint (`model.hf_path`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_suite.algorithms.agent import EpisodeSFT
from jaxrl_suite.algorithms.grpo import GRPOTrainer, GRPOTrainState
from jaxrl_suite.algorithms.grpo_config import GRPOConfig, rollout_config
from jaxrl_suite.algorithms.grpo_ondevice import GRPOProgram, check_on_device
from jaxrl_suite.algorithms.loop import fit_resumable, save_or_stop
from jaxrl_suite.algorithms.sft import VALIDATION_START, LMTrainer, SFTConfig, SFTTrainer
from jaxrl_suite.core.checkpoint import Checkpointer, CheckpointNotFoundError
from jaxrl_suite.core.config import (
    ConfigError,
    Count,
    NonNegativeInt,
    Positive,
    Range,
    Seed,
    check_fields,
)
from jaxrl_suite.core.experiment import EvalOptions, RunOptions
from jaxrl_suite.core.metrics import MetricsLogger, WandbConfig, plot_runs, read_metrics, write_json
from jaxrl_suite.core.parallel import MeshConfig, batch_shards, make_mesh, print0
from jaxrl_suite.core.study import Study, check_seeds, open_run_log
from jaxrl_suite.core.train import NonFiniteError
from jaxrl_suite.envs.text import TASKS, Example, Task
from jaxrl_suite.envs.text.tfds_tasks import DatasetTask
from jaxrl_suite.envs.text.tokenizer import Tokenizer, load_tokenizer
from jaxrl_suite.envs.vision import accuracy_by
from jaxrl_suite.models import CausalLM, LMConfig, VisionLM, VLMConfig
from jaxrl_suite.models.hf import (
    HFCheckpointError,
    ModelConfig,
    VisionModelConfig,
    load_hf_checkpoint,
)
from jaxrl_suite.models.lora import apply_lora, init_lora
from jaxrl_suite.models.sharding import check_model_mesh
from jaxrl_suite.sampling import KVCacheSampler, image_prompt, mcts
from jaxrl_suite.sampling.engines import drafter_config, make_engine

# Task options, passed to the task when set (None = the task's own default). A generator option
# that the task does not take is left out (a YAML written for one task runs another with
# --set task.name=...); a data option it does not take is a one-line error.
_GENERATOR_OPTIONS = ("digits", "num_numbers", "max_number", "max_target", "graded", "num_items",
                      "max_value", "max_count", "max_start", "level", "digit_order")
_DATA_OPTIONS = ("data_dir", "path", "test_path")
_PLACES = ("units", "tens", "hundreds", "thousands")  # LMStudy.answer_loss's place names


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    name: str = "arithmetic"  # a registered text task (jaxrl_suite.envs.text.TASKS), e.g. gsm8k
    prompt_len: Count = 16  # prompts are left-padded to this many tokens
    seed: Seed = 0  # the task generator's / dataset order's seed (train and test are disjoint)
    digits: Count | None = None  # arithmetic: operand digits
    digit_order: str | None = None  # arithmetic: answer digits "msb" (most significant first, the
    # task's default) or "lsb" (least significant first, in the order the carries run)
    num_numbers: Count | None = None  # countdown: numbers in the prompt
    max_number: Count | None = None  # countdown: numbers are drawn from 1..max_number
    max_target: Count | None = None  # countdown: targets lie in 1..max_target
    graded: bool | None = None  # countdown: partial credit for a valid expression that misses
    num_items: Count | None = None  # sort: numbers per list
    max_value: NonNegativeInt | None = None  # sort: numbers lie in 0..max_value
    max_count: Count | None = None  # count: answers hold 1..max_count numbers
    max_start: Count | None = None  # count: counts start in 10..10+max_start-1
    level: Count | None = None  # code: 1 (one-line integer functions) .. 3 (four-line loops)
    data_dir: str | None = None  # TFDS tasks (gsm8k, ag_news, imdb, trivia_qa, nq_open): data dir
    path: str | None = None  # jsonl: the local file of {"prompt": ..., "answer": ...} lines
    test_path: str | None = None  # jsonl: a held-out file (default: a hash split of `path`)

    def __post_init__(self):
        check_fields(self, "task.")  # the Ranges declared above

    def build(self) -> Task:
        """The task `name` with the options of this section that are set (one-line errors)."""
        cls = TASKS.get(self.name)
        takes = {f.name for f in dataclasses.fields(cls)}  # every task is a dataclass
        kwargs = {"seed": self.seed} if "seed" in takes else {}
        for k in _GENERATOR_OPTIONS + _DATA_OPTIONS:
            value = getattr(self, k)
            if value is not None and k not in takes and k in _DATA_OPTIONS:
                raise ConfigError(f"config field 'task.{k}' does not apply to task {self.name!r}")
            if value is not None and k in takes:
                kwargs[k] = value
        try:
            task = cls(**kwargs)
            if isinstance(task, DatasetTask):  # open the data now: a bad path stops here
                task.size("train"), task.size("test")
        except (TypeError, ValueError, FileNotFoundError, ImportError) as e:
            raise ConfigError(f"config section 'task' ({self.name}): {e}") from None
        return task

    @property
    def title(self) -> str:
        if self.name != "arithmetic":
            return self.name
        order = ", answers least-significant digit first" if self.digit_order == "lsb" else ""
        return f"{self.digits}-digit addition{order}"


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    num_examples: Count = 256  # held-out prompts for greedy accuracy
    batch_size: Count = 128  # rows per evaluation batch
    every: NonNegativeInt = 0  # also evaluate every this many training steps (0: at the end)
    samples: NonNegativeInt = 0  # sampled completions per prompt, pass@k / maj@k (0: greedy only)
    ks: tuple[Count, ...] = (1,)  # k of pass@k and maj@k (each <= samples)
    temperature: Positive = 1.0  # sampling temperature of the sampled evaluation
    sampled_examples: Count | None = None  # prompts of the sampled evaluation (None = all)

    def __post_init__(self):
        check_fields(self, "eval.")  # the Ranges declared above
        if self.samples and not (self.ks and all(1 <= k <= self.samples for k in self.ks)):
            raise ValueError(f"eval.ks={list(self.ks)} must lie in 1..eval.samples={self.samples}")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    seeds: tuple[Seed, ...] = (0,)  # one run per seed of each variant; a shared start (e.g. the
    # SFT checkpoint every variant starts from) is seeded with the first
    tokenizer: str = "byt5"  # "byt5" (bytes, no files), "bpe:N" (a byte-level BPE of N ids
    # trained on `task.texts()`, `tokenizer.train_bpe`) or a local HF tokenizer dir
    # (model.hf_path brings its own tokenizer, which replaces this one)
    num_devices: Count | None = None  # devices in the mesh (None = all, across hosts)
    mesh: MeshConfig = MeshConfig()  # axis sizes {data, fsdp, tensor}; -1 = the rest
    checkpoint_every: Count = 50  # save every this many steps of each stage
    # keep the last this many checkpoints per stage (>= 2: a step that does not read falls back
    # to the one before it, `core.checkpoint`)
    keep_checkpoints: Annotated[int, Range(ge=2)] = 2
    wandb: WandbConfig = WandbConfig()  # log to W&B as --wandb does (`enabled: true`)
    # Run the GRPO stage of all seeds as one vmapped program (`LMStudy.fit_seeds`,
    # algorithms/grpo_ondevice.py), where the experiment supports it; needs a task with a
    # token verifier (arithmetic, count, sort, countdown) and the static rollout engine.
    vmap_seeds: bool = False

    def __post_init__(self):
        check_fields(self, "run.")  # the Ranges declared above
        check_seeds(self.seeds)


@dataclasses.dataclass(frozen=True)
class LMSections:
    """The sections an `LMStudy` reads, and nothing else: the config of a second model in one
    experiment (`LMStudy.sibling`), whose experiment `Config` has other fields too."""

    task: TaskConfig
    model: ModelConfig
    sft: SFTConfig
    grpo: GRPOConfig
    eval: EvalConfig
    run: RunConfig


class Keys(NamedTuple):
    init: jax.Array  # model init
    sft: jax.Array  # SFT state RNG
    grpo: jax.Array  # RL state RNG


def lm_keys(seed: int) -> Keys:
    """The keys of one seed: split(PRNGKey(seed), 3)."""
    return Keys(*jax.random.split(jax.random.PRNGKey(seed), 3))


@dataclasses.dataclass(frozen=True)
class LM:
    """What `build_lm` returns: the model, its initial params, tokenizer, task and mesh."""

    model: CausalLM
    params: Any  # initial params: the HF checkpoint's, or a fresh init with the first seed
    tokenizer: Tokenizer
    task: Task
    mesh: Any
    pretrained: bool  # params come from model.hf_path (the same for every seed)

    def init_params(self, seed: int):
        """The initial params of `seed` (a pretrained checkpoint's for every seed)."""
        if self.pretrained:
            return self.params
        # the param shapes and values do not depend on the length of the init input
        return self.model.init(lm_keys(seed).init, jnp.zeros((1, 1), jnp.int32))


def _check_lengths(task: Task, tokenizer: Tokenizer, cfg, n: int = 256,
                   model_cfg: LMConfig | None = None) -> None:
    """Prompts (a vision-language model's with their image tokens) must fit `task.prompt_len`
    and solutions + EOS `grpo.max_new_tokens`."""
    examples = task.examples("train", 0, n) + task.examples("test", 0, n)
    if isinstance(model_cfg, VLMConfig):
        longest_prompt = max(len(image_prompt(tokenizer, e, model_cfg)[0]) for e in examples)
    else:
        longest_prompt = max(len(tokenizer.encode(e.prompt)) for e in examples)
    longest_solution = max(len(tokenizer.encode(task.solution(e))) + 1 for e in examples)
    for field, need, have in (("task.prompt_len", longest_prompt, cfg.task.prompt_len),
                              ("grpo.max_new_tokens", longest_solution, cfg.grpo.max_new_tokens)):
        if need > have:
            raise ConfigError(f"config field '{field}' is {have} but this task needs {need} tokens")


def check_batches(cfg, n_devices: int) -> None:
    """Training batches split evenly over the batch shards (mesh axes data x fsdp), and GRPO's
    prompts over the processes. (Evaluation rounds its batch to a multiple of them itself.)"""
    rows = {"sft.batch_size": cfg.sft.batch_size,
            "grpo.prompts_per_step": cfg.grpo.prompts_per_step * cfg.grpo.group_size}
    for field, n in rows.items():
        if n % n_devices:
            raise ConfigError(f"config field '{field}' gives {n} rows per batch, which does not "
                              f"divide evenly over the {n_devices} batch shards (mesh data x fsdp)")
    if cfg.grpo.prompts_per_step % jax.process_count():
        raise ConfigError(f"config field 'grpo.prompts_per_step' must divide by the "
                          f"{jax.process_count()} processes")


def build_lm(cfg, task: Task | None = None, *, model_class=CausalLM,
             tokenizer: Tokenizer | None = None) -> LM:
    """Tokenizer, task, mesh, model and initial params of an LM experiment's `cfg`.

    The params are a fresh init of `cfg.model` with the first of `cfg.run.seeds`, or the weights
    (and the tokenizer) of the local Hugging Face checkpoint `cfg.model.hf_path` when set; with
    `cfg.model.lora_rank` > 0 the model is LoRA-adapted (`models.lora.apply_lora`) and the params
    hold the adapters too (the trainers then train the adapters alone). `model_class` is the
    module built on the config (`CausalLM`, or `models.diffusion_lm.DiffusionLM`; a `VLMConfig`,
    from a `VisionModelConfig` section or a Qwen2-VL checkpoint, builds a `VisionLM`). `cfg`
    needs `task` (a `TaskConfig`), `model` (a `ModelConfig`), `sft`, `grpo` and `run` sections;
    `task` defaults to the one `cfg.task` names. `tokenizer` replaces the one `cfg.run.tokenizer`
    names (e.g. the tokenizer an earlier stage's model was trained with; `api.LM`); a
    checkpoint's (`model.hf_path`) is always its own.
    """
    task = cfg.task.build() if task is None else task
    if cfg.model.hf_path:  # a local Hugging Face checkpoint: its sizes, weights and tokenizer
        try:
            model_cfg, params, tokenizer = load_hf_checkpoint(cfg.model.hf_path,
                                                              **cfg.model.options())
        except (FileNotFoundError, HFCheckpointError) as e:
            raise ConfigError(f"config field 'model.hf_path': {e}") from None
    else:
        model_cfg, params = cfg.model.lm_config(), None
        if tokenizer is None:
            texts = task.texts() if cfg.run.tokenizer.startswith("bpe:") else None
            try:
                tokenizer = load_tokenizer(cfg.run.tokenizer, texts=texts)
            except (ValueError, FileNotFoundError) as e:
                raise ConfigError(f"config field 'run.tokenizer': {e}") from None
    if model_cfg.vocab_size < tokenizer.vocab_size:
        raise ConfigError(
            f"config field 'model.vocab_size' ({model_cfg.vocab_size}) is smaller than the "
            f"tokenizer's vocabulary ({tokenizer.vocab_size})"
        )
    _check_lengths(task, tokenizer, cfg, model_cfg=model_cfg)
    try:
        mesh = make_mesh(cfg.run.num_devices, **dataclasses.asdict(cfg.run.mesh))
        check_model_mesh(model_cfg, mesh)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    check_batches(cfg, batch_shards(mesh))
    if isinstance(model_cfg, VLMConfig):  # a VisionModelConfig or a Qwen2-VL checkpoint
        model_class = VisionLM
    model = model_class(model_cfg)
    lora = getattr(cfg.model, "lora", None)
    if lora is not None:  # model.lora_rank > 0: adapters on a frozen base (models/lora.py)
        model = apply_lora(model, lora)
        if params is not None:  # the checkpoint's weights, plus fresh adapters (B = 0)
            params = init_lora(model, params, lm_keys(cfg.run.seeds[0]).init)
    lm = LM(model, params, tokenizer, task, mesh, pretrained=params is not None)
    if params is None:
        check_memory(model, mesh, lora=lora is not None)  # before anything is allocated
        lm = dataclasses.replace(lm, params=lm.init_params(cfg.run.seeds[0]))
    return lm


def _device_memory(mesh) -> tuple[int, str]:
    """(bytes, where) the mesh's local devices can hold: their `memory_stats()` limits where
    the backend reports them (GPU, TPU), else the host's available memory (CPU)."""
    local = [d for d in mesh.devices.flat if d.process_index == jax.process_index()]
    stats = [d.memory_stats() or {} for d in local]
    if stats and all("bytes_limit" in s for s in stats):
        return sum(s["bytes_limit"] for s in stats), f"{len(local)} {local[0].platform} device(s)"
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"), "the host's free memory"


def check_memory(model, mesh, *, lora: bool = False) -> None:
    """A start-up check, before any compilation: the model's params, a frozen reference copy,
    gradients and AdamW's two moments (of the trained part: adapters only under LoRA) must fit
    in the memory `_device_memory` reports, else one ConfigError with the estimate and the
    knobs that reduce it. Activations are not counted: the estimate is a lower bound."""
    shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, 1), jnp.int32))
    leaves = jax.tree.leaves(shapes)
    params = sum(x.size * x.dtype.itemsize for x in leaves)
    need = params * (2 if lora else 5)  # params + reference (+ gradients and two moments)
    have, where = _device_memory(mesh)
    if need > have:
        n = sum(x.size for x in leaves)
        raise ConfigError(
            f"the model has {n / 1e6:,.0f}M params: training needs at least "
            f"{need / 2**30:,.1f} GiB (params, reference, gradients, AdamW moments), more than "
            f"the {have / 2**30:,.1f} GiB of {where}; make it smaller (model.d_model, "
            f"model.n_layers), shard it (run.mesh.fsdp), train in bf16 (model.param_dtype), "
            f"train adapters only (model.lora_rank) or use micro-batches "
            f"(grpo.memory.train_micro_batch)")


class LMStudy(Study):
    """A `Study` of LM runs: trainers on the shared model, resumable stages, evaluation.
    `model_class` is the module of the shared model (`algorithms.diffusion.DiffusionStudy`
    sets a diffusion LM, with its own samplers and trainers)."""

    model_class = CausalLM

    def __init__(self, name: str, cfg, opts: RunOptions, *, variants: Sequence[str],
                 task: Task | None = None, write_config: bool = True,
                 tokenizer: Tokenizer | None = None, seeds_on_device: bool = False):
        """`seeds_on_device`: the experiment runs its GRPO seeds as one program when
        run.vmap_seeds is set (`fit_seeds`); without it, run.vmap_seeds is a config error."""
        super().__init__(name, opts, variants, cfg.run.seeds)
        self.cfg = cfg
        self.lm = build_lm(cfg, task, model_class=self.model_class, tokenizer=tokenizer)
        if cfg.run.vmap_seeds:
            try:
                if not seeds_on_device:
                    raise ValueError(f"experiment {name!r} runs its seeds in the host loop")
                check_on_device(cfg.grpo)
                if cfg.grpo.beta > 0:  # the program holds one reference; each seed has its own
                    raise ValueError(f"grpo.beta={cfg.grpo.beta} needs each seed's own "
                                     f"reference model, which the one program does not hold")
                if self.lm.task.token_verifier(self.lm.tokenizer) is None:
                    raise ValueError(f"task {self.lm.task.name!r} has no token verifier")
            except ValueError as e:
                raise ConfigError(f"config field 'run.vmap_seeds': {e}") from None
        self.held_out = self.lm.task.examples("test", 0, cfg.eval.num_examples)
        self._samplers: dict[tuple, KVCacheSampler] = {}  # one compiled program per setting
        if write_config:
            self.write_config(cfg)

    def sibling(self, model: ModelConfig, variants: Sequence[str], *,
                task: Task | None = None, prompt_len: int | None = None,
                max_new_tokens: int | None = None, sft: SFTConfig | None = None,
                tokenizer: str | None = None) -> LMStudy:
        """A second model of the same study (output directory, seeds, eval and mesh settings),
        e.g. a larger model trained the same way, or a frozen model with its own job (s3's
        generator). Its runs are `variants` (names its run and checkpoint directories must not
        share with this study's); config.json stays this study's. It is a causal-LM `LMStudy`
        whatever this study's model class (a `DiffusionStudy`'s AR reference).

        By default it has this study's task, SFT and tokenizer; `task` (with its
        `prompt_len`), `max_new_tokens`, `sft` and `tokenizer` (a `run.tokenizer` value) give it
        its own. Its config is an `LMSections` of these."""
        c = self.cfg
        task_cfg = c.task if task is None else dataclasses.replace(c.task, name=task.name)
        if prompt_len is not None:
            task_cfg = dataclasses.replace(task_cfg, prompt_len=prompt_len)
        grpo = c.grpo if max_new_tokens is None else dataclasses.replace(
            c.grpo, max_new_tokens=max_new_tokens)
        run = c.run if tokenizer is None else dataclasses.replace(c.run, tokenizer=tokenizer)
        cfg = LMSections(task=task_cfg, model=model, sft=c.sft if sft is None else sft,
                         grpo=grpo, eval=c.eval, run=run)
        return LMStudy(self.name, cfg, self.opts, variants=variants,
                       task=self.lm.task if task is None else task, write_config=False)

    def sampler(self, *, greedy: bool = False, top_k: int = 0, temperature: float = 1.0,
                top_p: float = 1.0) -> KVCacheSampler:
        """The study's KV-cache sampler for these settings, shared by all its trainers (so each
        compiles once per study, not once per trainer)."""
        key = (greedy, top_k, temperature, top_p)
        if key not in self._samplers:
            tok = self.lm.tokenizer
            self._samplers[key] = KVCacheSampler(
                self.lm.model, max_new_tokens=self.cfg.grpo.max_new_tokens, eos_id=tok.eos_id,
                pad_id=tok.pad_id, greedy=greedy, top_k=top_k, temperature=temperature,
                top_p=top_p)
        return self._samplers[key]

    def _eval_samplers(self) -> dict:
        return {"greedy_sampler": self.sampler(greedy=True), "eval_sampler": self.sampler()}

    @property
    def start_seed(self) -> int:
        return self.seeds[0]

    def grpo_key(self, seed: int) -> jax.Array:
        """A run's RL key when every run starts from the shared start (of the first seed)."""
        return jax.random.fold_in(lm_keys(self.start_seed).grpo, seed)

    @property
    def sampled_key(self) -> jax.Array:
        """The fixed key of the held-out evaluations that draw one sample per prompt at the
        training temperature: `sampled_accuracy`'s, and a study's own (e.g. sampled decisions
        or self-iteration steps through `LMRunner.complete`)."""
        return jax.random.PRNGKey(self.start_seed + 2)

    # ---- trainers on the shared model ----
    def sft_trainer(self, task: Task | None = None, config: SFTConfig | None = None
                    ) -> SFTTrainer:
        """The study's SFT on `task` with `config` (default: the study's sft section; another
        SFTConfig for a second SFT stage, e.g. a shared base before per-run SFTs)."""
        c = self.cfg
        return SFTTrainer(self.lm.model, self.lm.tokenizer, task or self.lm.task,
                          config or c.sft,
                          mesh=self.lm.mesh, prompt_len=c.task.prompt_len,
                          max_new_tokens=c.grpo.max_new_tokens, **self._eval_samplers())

    def lm_trainer(self, task: Task | None = None, *, prompt_len: int | None = None
                   ) -> LMTrainer:
        """Sampling and evaluation alone (`sampling.LMRunner`: complete, score, evaluate) with
        the study's shared samplers, on prompts of `prompt_len` tokens (default task.prompt_len;
        e.g. prompt_len + max_new_tokens for a search over partial solutions)."""
        return LMTrainer(self.lm.model, self.lm.tokenizer, task or self.lm.task,
                         mesh=self.lm.mesh, prompt_len=prompt_len or self.cfg.task.prompt_len,
                         max_new_tokens=self.cfg.grpo.max_new_tokens, **self._eval_samplers())

    def grpo_trainer(self, config: GRPOConfig, ref_params, task: Task | None = None, *,
                     drafter_params=None, prompt_len: int | None = None) -> GRPOTrainer:
        """A GRPO trainer on the study's model. Its rollout engine is `grpo.rollout.engine`: the
        study's shared static sampler, or a continuous / speculative one of its own (the speculative
        drafter starting from `drafter_params`, e.g. `warm_drafter`'s). Prompts are left-padded
        to `prompt_len` tokens (default task.prompt_len; longer for partial-solution prompts)."""
        if config.max_new_tokens != self.cfg.grpo.max_new_tokens:
            raise ValueError("every GRPO variant of a study shares grpo.max_new_tokens")
        rollout = make_engine(self.lm.model, rollout_config(config), self.lm.tokenizer,
                              drafter_params=drafter_params, shared=self.sampler(
                                  top_k=config.top_k, temperature=config.temperature,
                                  top_p=config.top_p))
        return GRPOTrainer(self.lm.model, self.lm.tokenizer, task or self.lm.task, config,
                           mesh=self.lm.mesh, prompt_len=prompt_len or self.cfg.task.prompt_len,
                           ref_params=ref_params, sampler=rollout, **self._eval_samplers())

    def warm_drafter(self, config: GRPOConfig, params, *, steps: int, seed: int = 0,
                     batch_size: int = 64):
        """Drafter params for a speculative rollout engine: a fresh `drafter_config` model
        distilled (`SpeculativeSampler.distill`, forward KL to `params`) for `steps` steps on
        batches of the task's solutions, the SFT data. Deterministic in `seed`."""
        rc = rollout_config(config)
        init = CausalLM(drafter_config(self.lm.model.config, rc)).init(
            jax.random.key(seed), jnp.zeros((1, 4), jnp.int32))
        sampler = make_engine(self.lm.model, rc, self.lm.tokenizer, drafter_params=init)
        sft = self.sft_trainer()
        for i in range(steps):
            examples = self.lm.task.examples("train", i * batch_size, batch_size)
            sampler.distill(params, sft.solution_batch(examples), steps=1)
        return sampler.drafter_params

    def expand_fn(self, params, *, prompt_len: int, batch_size: int, rng: jax.Array,
                  finished: Callable[[str], bool] | None = None):
        """An `expand_fn(states, n)` for `sampling.mcts`: n sampled continuations (to EOS) of
        each state by `params`, each a `mcts.Sample(text, generated tokens)`, in fixed-size
        batches of `batch_size` rows with key fold_in(rng, call). A state that does not fit
        `prompt_len` tokens, or that `finished(state)` says is complete, is finished as it is:
        one empty, terminal sample that costs nothing."""
        trainer, tok, calls = self.lm_trainer(prompt_len=prompt_len), self.lm.tokenizer, [0]

        def expand(states, n):
            open_ = [len(tok.encode(st)) <= prompt_len and not (finished and finished(st))
                     for st in states]
            flat = [Example(prompt=st, answer="") for st, ok in zip(states, open_, strict=True)
                    if ok for _ in range(n)]
            texts, lengths = trainer.complete(
                params, flat, batch_size=batch_size,
                rng=jax.random.fold_in(rng, calls[0])) if flat else ([], [])
            calls[0] += 1
            out, i = [], 0
            for ok in open_:
                if not ok:
                    out.append([mcts.Sample("", 0)])
                    continue
                out.append([mcts.Sample(texts[i + j], int(lengths[i + j])) for j in range(n)])
                i += n
            return out

        return expand

    # ---- resumable stages ----
    def fit(self, trainer, init, *, stage: str, num_steps: int, checkpoint_dir: Path,
            logger: MetricsLogger, step_offset: int = 0, postfix: Sequence[str] = ("loss",),
            callback: Callable | None = None, cursor: int = 0):
        """One resumable stage (`algorithms.loop.fit_resumable`) with this study's settings."""
        r = self.cfg.run
        return fit_resumable(
            trainer, init, stage=stage, num_steps=num_steps, checkpoint_dir=checkpoint_dir,
            logger=logger, save_every=r.checkpoint_every, keep=r.keep_checkpoints,
            resume=self.opts.resume, step_offset=step_offset, progress=self.opts.progress,
            postfix=postfix, callback=callback, cursor=cursor)

    def log(self, log_dir: Path, stages: Sequence[tuple[Path, int]]) -> MetricsLogger:
        """The metrics log of a run whose stages checkpoint in `stages` [(dir, step offset)]."""
        return open_run_log(log_dir, stages, resume=self.opts.resume,
                            tensorboard=self.opts.tensorboard, wandb=self.opts.wandb)

    def sft(self, seed: int, *, checkpoint_dir: Path, logger: MetricsLogger,
            task: Task | None = None, params=None, trainer: SFTTrainer | None = None,
            callback: Callable[[int, Any], dict] | None = None):
        """The SFT stage from `params` (default: `seed`'s initial params); returns the final
        SFT state. `trainer` runs it instead of a new `sft_trainer(task)`: e.g. one shared
        trainer's `with_task(task)` for several data mixes, which compiles its step once.
        `callback(n, state)` replaces `early_stop`'s (its "stop" ends the stage, resumably)."""
        if trainer is not None and task is not None:
            raise ValueError("sft: pass the task in the trainer (trainer.with_task(task))")
        sft = self.sft_trainer(task) if trainer is None else trainer
        init = sft.init_state(self.lm.init_params(seed) if params is None else params,
                              lm_keys(seed).sft)
        return self.fit(sft, init, stage="sft", num_steps=self.cfg.sft.steps,
                        checkpoint_dir=checkpoint_dir, logger=logger,
                        callback=self.early_stop(sft) if callback is None else callback)

    def answer_loss(self, trainer, params) -> dict[str, float]:
        """The teacher-forced NLL (nats) of each answer character of the held-out problems,
        averaged by position: by place value ("units", "tens", ...) for a task with
        `answer_places` (arithmetic), else "char 0", "char 1", ... A start whose loss on some
        position stays at chance (ln 10 = 2.30 for a digit) cannot learn it. Needs a byte-level
        tokenizer (one token per character) and an answer that its solution spells out; {}
        otherwise. `trainer` gives the log-probs (`completion_logprobs`: a GRPO trainer's)."""
        task, tok, examples = self.lm.task, self.lm.tokenizer, self.held_out
        sols = [task.solution(e) for e in examples]
        if any(len(tok.encode(s)) != len(s.encode()) or e.answer not in s
               for e, s in zip(examples, sols, strict=True)):
            return {}
        logp, mask = trainer.score(params, examples, logprob_fn=trainer.completion_logprobs)
        nll = -logp * mask
        by_place = hasattr(task, "answer_places")

        def name(p: int) -> str:
            if not by_place:
                return f"char {p}"
            return _PLACES[p] if p < len(_PLACES) else f"10^{p}"

        losses: dict[int, list[float]] = {}
        for row, e, sol in zip(nll, examples, sols, strict=True):
            first = sol.index(e.answer)  # the answer's first character in the solution
            positions = task.answer_places(e) if by_place else range(len(e.answer))
            for i, p in enumerate(positions):
                losses.setdefault(p, []).append(float(row[first + i]))
        return {name(p): float(np.mean(v)) for p, v in sorted(losses.items())}

    def continued_sft(self, state, *, steps: int, checkpoint_dir: Path, log_dir: Path,
                      task: Task | None = None, trainer=None):
        """The control beside an RL run: the SFT that produced `state` continued for `steps`
        more optimizer steps (same schedule) on the data it would have read next; resumable,
        logged as stage "sft_more" to log_dir/metrics.jsonl. `trainer` is the SFT that made
        `state` when it is not `sft_trainer(task)` (e.g. an `EpisodeSFT`). Returns the final
        state."""
        trainer = self.sft_trainer(task) if trainer is None else trainer
        with self.log(log_dir, [(checkpoint_dir, 0)]) as logger:
            return self.fit(trainer, state, stage="sft_more",
                            num_steps=int(state.step) + steps, checkpoint_dir=checkpoint_dir,
                            logger=logger, cursor=int(state.step) * self.cfg.sft.batch_size)

    def sft_control(self, state, evaluate: Callable[[Any], dict], *, name: str = "sft_more",
                    trainer=None) -> dict:
        """The continued-SFT control of a study with one shared SFT: `continued_sft` of `state`
        for grpo.steps more steps (checkpoints/NAME, runs/NAME), then `evaluate(params)`,
        cached in runs/NAME/eval.json (a resumed study reads it back). Returns the evaluation."""
        more = self.continued_sft(state, steps=self.cfg.grpo.steps, trainer=trainer,
                                  checkpoint_dir=self.checkpoint_dir(name),
                                  log_dir=self.run_dir(name))
        return self.cached(self.run_dir(name) / "eval.json", lambda: evaluate(more.params))

    def early_stop(self, trainer) -> Callable[[int, Any], dict] | None:
        """The SFT's early-stopping callback (`SFTConfig.stop_accuracy`; None when off): every
        sft.stop_every steps, greedy accuracy on the validation problems (`val_accuracy`), and
        "stop" once it reaches sft.stop_accuracy."""
        c = self.cfg.sft
        if c.stop_accuracy is None:
            return None
        examples = trainer.task.examples("train", VALIDATION_START, c.stop_examples)

        def callback(n, state):
            if n % c.stop_every:
                return {}
            acc = trainer.evaluate(state.params, examples,
                                   batch_size=self.cfg.eval.batch_size)["accuracy"]
            return {"val_accuracy": acc, "stop": acc >= c.stop_accuracy}

        return callback

    def shared_sft(self, task: Task | None = None, params=None, *, name: str = "sft",
                   callback: Callable[[int, Any], dict] | None = None):
        """One SFT checkpoint (checkpoints/NAME) that every run starts from, trained from the
        first seed (from `params` if given, e.g. another model's weights). Logged to the study's
        metrics.jsonl, or to runs/NAME/metrics.jsonl for another `name` (a sibling study's SFT
        in the same output directory). `callback`: `sft`'s."""
        ckpt = self.out_dir / "checkpoints" / name
        log_dir = self.out_dir if name == "sft" else self.run_dir(name)
        with self.log(log_dir, [(ckpt, 0)]) as logger:
            return self.sft(self.start_seed, checkpoint_dir=ckpt, logger=logger, task=task,
                            params=params, callback=callback)

    def episode_sft(self, runner, demos, *, name: str, task: Task | None = None):
        """One SFT checkpoint on expert episodes (`algorithms.agent.EpisodeSFT` over `runner`'s
        turn layout) from the study's fresh model at its first seed, sft.steps steps,
        checkpointed under checkpoints/NAME and logged to runs/NAME/metrics.jsonl (resumable).
        Returns (the final state, the trainer, to continue it with `sft_control`)."""
        trainer = EpisodeSFT(self.sft_trainer(task), runner, demos, seed=self.start_seed)
        init = trainer.init_state(self.lm.init_params(self.start_seed),
                                  lm_keys(self.start_seed).sft)
        ckpt = self.checkpoint_dir(name)
        with self.log(self.run_dir(name), [(ckpt, 0)]) as logger:
            state = self.fit(trainer, init, stage="sft", num_steps=self.cfg.sft.steps,
                             checkpoint_dir=ckpt, logger=logger)
        return state, trainer

    def fit_run(self, trainer, init, variant: str, seed: int, *, num_steps: int,
                postfix: Sequence[str] = ("reward",), stage: str = "grpo"):
        """A run's one stage, checkpointed under checkpoints/VARIANT_sSEED and logged to
        runs/VARIANT_sSEED/metrics.jsonl."""
        ckpt = self.checkpoint_dir(variant, seed)
        with self.log(self.run_dir(variant, seed), [(ckpt, 0)]) as logger:
            return self.fit(trainer, init, stage=stage, num_steps=num_steps,
                            checkpoint_dir=ckpt, logger=logger, postfix=postfix)

    def fit_seeds(self, trainer: GRPOTrainer, starts: Mapping[int, Any], *,
                  loggers: Mapping[int, MetricsLogger], checkpoint_dir: Path,
                  step_offset: int = 0) -> dict[int, GRPOTrainState]:
        """The GRPO stage of several seeds as one vmapped program (`run.vmap_seeds`;
        `algorithms.grpo_ondevice`): seed s starts from params starts[s] with key
        lm_keys(s).grpo, as `fit` would start it. The program runs in chunks of
        gcd(run.checkpoint_every, eval.every) steps; after each, every seed's steps are logged
        to loggers[s] as `fit` logs them (stage "grpo", step step_offset + n; tokens_per_s is
        the seed's tokens over the chunk's wall time), `periodic_eval`'s records are added, and
        the stacked state is checkpointed in `checkpoint_dir` every run.checkpoint_every steps
        (resumed from there with --resume, like every stage). Returns {seed: final state}."""
        c, r, e = trainer.config, self.cfg.run, self.cfg.eval
        seeds = list(starts)
        program = GRPOProgram(trainer, steps=c.steps)
        keys = jnp.stack([lm_keys(s).grpo for s in seeds])
        params = jax.tree.map(lambda *x: jnp.stack(x), *[starts[s] for s in seeds])
        state = jax.jit(jax.vmap(program.init))(keys, params)
        chunk = math.gcd(r.checkpoint_every, e.every) if e.every else r.checkpoint_every
        ckpt = Checkpointer(checkpoint_dir, save_every=r.checkpoint_every,
                            keep=r.keep_checkpoints)
        try:
            if self.opts.resume and ckpt.latest_step() is not None:
                state, _ = ckpt.restore(state)
            while (done := int(state.step[0])) < c.steps:
                t0, k = time.perf_counter(), min(chunk, c.steps - done)
                state, metrics = program.run_fn(k)(state)
                metrics = jax.tree.map(np.asarray, metrics)  # [S, k] each
                dt = time.perf_counter() - t0
                if not metrics.pop("finite").all():
                    raise NonFiniteError(f"non-finite loss, gradient or update in GRPO steps "
                                         f"{done + 1}..{done + k} (run.vmap_seeds); the last "
                                         f"good checkpoint is kept in {ckpt.directory}")
                for i, seed in enumerate(seeds):
                    for j in range(k):
                        n = done + j + 1
                        record = {key: float(v[i, j]) for key, v in metrics.items()}
                        record["tokens_per_s"] = record["tokens"] * k / dt
                        if e.every and n % e.every == 0 and n != c.steps:
                            record.update(eval_record(self.evaluate(
                                trainer, jax.tree.map(lambda x, i=i: x[i], state.params))))
                        loggers[seed].log({"step": step_offset + n, "stage": "grpo", **record})
                save_or_stop(ckpt, done + k, state, {"cursor": (done + k) * program.pool},
                             stage=f"grpo (seeds {seeds})", force=done + k == c.steps)
                print0(f"[{self.name}] grpo steps {done + k}/{c.steps} of seeds {seeds} "
                       f"({dt:.1f} s)")
            ckpt.wait()
        finally:
            ckpt.close()
        return {s: jax.tree.map(lambda x, i=i: x[i], state) for i, s in enumerate(seeds)}

    # ---- evaluation ----
    def periodic_eval(self, trainer, num_steps: int) -> Callable[[int, Any], dict]:
        """A `fit` callback: `eval_record` fields every `eval.every` steps (not the last)."""
        every = self.cfg.eval.every

        def callback(n, state):
            if every and n % every == 0 and n != num_steps:
                return eval_record(self.evaluate(trainer, state.params))
            return {}

        return callback

    def evaluate(self, trainer, params, examples=None, *, reward: bool = False) -> dict:
        """Greedy held-out accuracy and `sampled_accuracy`, the pass@1 of one sample per prompt
        at the training temperature (grpo.temperature) on the first eval.sampled_examples
        prompts (what RL optimises; a policy trained on samples can gain there and not in the
        greedy figure), plus sampled pass@k / maj@k when `eval.samples` > 0. With `reward`,
        also `mean_reward`, the mean reward of the greedy completions (`LMTrainer.evaluate`)."""
        e = self.cfg.eval
        examples = self.held_out if examples is None else examples
        greedy = trainer.evaluate(params, examples, batch_size=e.batch_size)
        out = {"greedy_accuracy": greedy["accuracy"]}
        if reward:
            out["mean_reward"] = greedy["reward"]
        if e.samples:
            out.update(trainer.evaluate_sampled(
                params, examples[: e.sampled_examples], n=e.samples, ks=e.ks,
                temperature=e.temperature, batch_size=e.batch_size,
                rng=jax.random.PRNGKey(self.start_seed + 1)))
        if "pass@1" in out and e.temperature == self.cfg.grpo.temperature:
            out["sampled_accuracy"] = out["pass@1"]  # those samples already give it
        else:
            out["sampled_accuracy"] = self.sampled_accuracy(trainer, params, examples)
        return out

    def group_samples(self, trainer, params, examples, *, group_size: int | None = None):
        """group_size (default grpo.group_size) samples of each of `examples` at
        grpo.temperature with `sampled_key`, in eval.batch_size batches, scored by the trainer's
        task: (the examples repeated group-wise, the texts, the task's Verdicts)."""
        n = group_size or self.cfg.grpo.group_size
        flat = [e for e in examples for _ in range(n)]
        texts, _ = trainer.complete(params, flat, batch_size=self.cfg.eval.batch_size,
                                    rng=self.sampled_key, temperature=self.cfg.grpo.temperature)
        return flat, texts, trainer.task.verify_batch(texts, flat)

    def group_check(self, trainer, params, examples, *, group_size: int | None = None
                    ) -> dict[str, float]:
        """An RL start's check on `examples` (training questions, never the held-out set): the
        `group_samples`. Returns `sampled_accuracy`, `mean_reward` (the designed reward where
        the task has one) and `nondegenerate_share`, the share of groups whose rewards are not
        all equal (the groups GRPO can learn from)."""
        n = group_size or self.cfg.grpo.group_size
        _, _, v = self.group_samples(trainer, params, examples, group_size=n)
        rewards = np.asarray(v.scores if v.rewards is None else v.rewards).reshape(-1, n)
        return {"sampled_accuracy": float(np.mean(np.asarray(v.scores) == 1.0)),
                "mean_reward": float(rewards.mean()),
                "nondegenerate_share": float((rewards.std(axis=1) > 0).mean())}

    @staticmethod
    def passes_start_rule(check: Mapping[str, float], rule: Mapping[str, Any]) -> bool:
        """Whether a `group_check` passes an RL start's rule: sampled accuracy within
        rule["accuracy_band"] (lo, hi; inclusive) and a share of non-degenerate groups of at
        least rule["min_nondegenerate"]."""
        lo, hi = rule["accuracy_band"]
        return bool(lo <= check["sampled_accuracy"] <= hi
                    and check["nondegenerate_share"] >= rule["min_nondegenerate"])

    def sampled_accuracy(self, trainer, params, examples=None) -> float:
        """pass@1 of one sample per prompt at the training temperature (grpo.temperature) on
        the first eval.sampled_examples of `examples` (default the held-out prompts), in
        eval.batch_size batches (the greedy evaluation's shape) with `sampled_key`."""
        e = self.cfg.eval
        examples = self.held_out if examples is None else examples
        return trainer.evaluate_sampled(
            params, examples[: e.sampled_examples], n=1, ks=(1,),
            temperature=self.cfg.grpo.temperature, batch_size=e.batch_size,
            rng=self.sampled_key)["pass@1"]

    def labelled_accuracy(self, trainer, params, examples: Sequence[Example],
                          *labels: Callable[[Example], Any], sampled: bool = True):
        """Accuracy on `examples` overall and per label, scored by the trainer's task: greedy
        (`greedy_accuracy`, `acc_<label>`) and, with `sampled`, one sample at grpo.temperature
        with `sampled_key` on the first eval.sampled_examples (`sampled_accuracy`,
        `sampled_<label>`), in eval.batch_size batches. Each of `labels` maps an example to its
        label (a question family, a level). Returns (the figures, (greedy texts, their lengths,
        their Verdicts)), the latter for an experiment's own statistics."""
        e = self.cfg.eval
        texts, lengths = trainer.complete(params, examples, batch_size=e.batch_size)
        verdicts = trainer.task.verify_batch(texts, examples)
        runs = [("acc_", "greedy_accuracy", examples, verdicts.scores)]
        if sampled:
            some = examples[: e.sampled_examples]
            drawn, _ = trainer.complete(params, some, batch_size=e.batch_size,
                                        rng=self.sampled_key,
                                        temperature=self.cfg.grpo.temperature)
            runs.append(("sampled_", "sampled_accuracy", some,
                         trainer.task.verify_batch(drawn, some).scores))
        out = {}
        for prefix, total, ex, scores in runs:
            out[total] = float(np.mean(scores))
            for label in labels:
                out.update({prefix + k: x for k, x in accuracy_by([label(x) for x in ex],
                                                                  scores).items()})
        return out, (texts, lengths, verdicts)


    @staticmethod
    def restore(trainer, template, directory: Path, *, what: str = "restore",
                step: int | None = None):
        """The checkpoint at `step` (default: the latest) in `directory` as a state shaped like
        `template` (the trainer's `trainable` params only, for LoRA); CheckpointNotFoundError if
        there is none (or not that step)."""
        ckpt = Checkpointer(directory, trainable=trainer.trainable)
        try:
            if ckpt.latest_step() is None:
                raise CheckpointNotFoundError(f"{what}: no checkpoint in {directory}")
            if step is not None and step not in ckpt.all_steps():
                raise CheckpointNotFoundError(f"{what}: no step {step} in {directory} (steps: "
                                              f"{sorted(ckpt.all_steps())})")
            state, _ = ckpt.restore(template, step=step)
        finally:
            ckpt.close()
        return state

    def evaluate_checkpoint(self, opts: EvalOptions, variant: str) -> dict:
        """`jaxrl-suite eval RUN_DIR [--stage S] [--seed N]`: greedy accuracy and sampled
        pass@k / maj@k of the latest checkpoint of stage "sft" or "grpo" of run VARIANT_sSEED
        (default seed: the first), under checkpoints/VARIANT_sSEED/STAGE; also written to
        RUN_DIR/eval_STAGE.json (eval_STAGE_sSEED.json with --seed)."""
        if opts.stage not in ("sft", "grpo"):
            raise ConfigError(f"eval: --stage must be 'sft' or 'grpo', got {opts.stage!r}")
        seed = self.start_seed if opts.seed is None else opts.seed
        if seed not in self.seeds:
            raise ConfigError(f"eval: --seed {seed} is not one of run.seeds {list(self.seeds)}")
        keys = lm_keys(seed)
        trainer = self.sft_trainer() if opts.stage == "sft" else \
            self.grpo_trainer(self.cfg.grpo, ref_params=self.lm.params)
        template = trainer.init_state(self.lm.params, keys.sft if opts.stage == "sft" else
                                      keys.grpo)
        state = self.restore(trainer, template,
                             self.checkpoint_dir(variant, seed) / opts.stage, what="eval")
        held_out = self.lm.task.examples("test", 0, opts.num_examples)
        result = {"stage": opts.stage, "seed": seed, "step": int(state.step),
                  "examples": len(held_out), "samples": opts.samples,
                  "temperature": opts.temperature,
                  "greedy_accuracy": trainer.evaluate(
                      state.params, held_out, batch_size=self.cfg.eval.batch_size)["accuracy"]}
        result.update(trainer.evaluate_sampled(
            state.params, held_out, n=opts.samples, ks=opts.ks, temperature=opts.temperature,
            batch_size=self.cfg.eval.batch_size, rng=jax.random.PRNGKey(seed + 1)))
        if jax.process_index() == 0:
            suffix = "" if opts.seed is None else f"_s{seed}"
            write_json(opts.run_dir / f"eval_{opts.stage}{suffix}.json", result)
        return result

    def plot_runs(self, keys: Sequence[str], path: Path, *, stage: str, smooth: int = 1,
                  title: str = "") -> None:
        """One panel per key, one curve per variant: median and IQR over seeds of each run's
        `stage` records (`core.metrics.plot_runs`); process 0 only."""
        if jax.process_index() != 0:
            return
        runs = {v: [read_metrics(self.run_dir(v, s) / "metrics.jsonl") for s in self.seeds]
                for v in self.variants}
        plot_runs(runs, keys, path, stage=stage, smooth=smooth,
                  title=title or f"{self.name}: median and IQR over {len(self.seeds)} seeds")


def eval_record(result: dict) -> dict:
    """An evaluation as metrics.jsonl fields: eval_accuracy, eval_pass@k, eval_maj@k."""
    return {"eval_accuracy": result["greedy_accuracy"],
            **{f"eval_{k}": v for k, v in result.items()
               if k not in ("greedy_accuracy", "length")}}


__all__ = ["LM", "EvalConfig", "GRPOConfig", "LMStudy", "ModelConfig", "RunConfig", "SFTConfig",
           "TaskConfig", "VisionModelConfig", "build_lm", "check_batches", "eval_record",
           "lm_keys"]
