"""GRPO on multi-digit addition: a small causal LM trained from scratch on CPU.

Claim checked (DeepSeekMath, arXiv 2402.03300): RL with a verifiable reward and group-relative
advantages raises held-out accuracy above the supervised (SFT-only) starting point.

    jaxrl-suite run grpo_arithmetic                     # full size (minutes on a 2-core CPU)
    jaxrl-suite run grpo_arithmetic --smoke             # seconds; what the tests run
    python experiments/grpo_arithmetic.py --set grpo.steps=50

Stages: SFT warm-up (teacher forcing on `<answer>a+b</answer>`) -> held-out greedy accuracy ->
GRPO -> held-out greedy accuracy. Writes results/grpo_arithmetic/{metrics.jsonl, summary.json,
reward_curve.png} and checkpoints under results/grpo_arithmetic/checkpoints/{sft,grpo}.
"""

from __future__ import annotations

import dataclasses
import sys
import time

import jax

from jaxrl_suite.algorithms.grpo import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer
from jaxrl_suite.algorithms.loop import fit
from jaxrl_suite.core.checkpoint import Checkpointer, CheckpointNotFoundError
from jaxrl_suite.core.config import ConfigError, to_dict
from jaxrl_suite.core.experiment import EvalOptions, Experiment, RunOptions
from jaxrl_suite.core.metrics import MetricsLogger, plot_curves, read_metrics, write_json
from jaxrl_suite.core.parallel import make_mesh
from jaxrl_suite.envs.text import TASKS, Task
from jaxrl_suite.envs.text.tfds_tasks import DatasetTask
from jaxrl_suite.envs.text.tokenizer import load_tokenizer
from jaxrl_suite.models import CausalLM
from jaxrl_suite.models.hf import HFCheckpointError, ModelConfig, load_hf_checkpoint

NAME = "grpo_arithmetic"


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    name: str = "arithmetic"  # registered text task (see jaxrl_suite.envs.text.TASKS), e.g. gsm8k
    digits: int = 2  # arithmetic: operand digits
    seed: int = 0  # seed of the task's example generator / dataset order (splits are disjoint)
    prompt_len: int = 6  # prompts are left-padded to this many tokens
    data_dir: str | None = None  # TFDS tasks (gsm8k, ag_news, imdb, trivia_qa, nq_open): data dir
    path: str | None = None  # jsonl: the local file of {"prompt": ..., "answer": ...} lines
    test_path: str | None = None  # jsonl: a held-out file (default: a hash split of `path`)

    def build(self) -> Task:
        """The task `name` with the fields of this section that it takes (one-line errors)."""
        cls = TASKS.get(self.name)
        takes = {f.name for f in dataclasses.fields(cls)}  # every task is a dataclass
        kwargs = {k: getattr(self, k) for k in ("digits", "seed") if k in takes}
        for k in ("data_dir", "path", "test_path"):
            value = getattr(self, k)
            if value is not None and k not in takes:
                raise ConfigError(f"config field 'task.{k}' does not apply to task {self.name!r}")
            if value is not None:
                kwargs[k] = value
        try:
            task = cls(**kwargs)
            if isinstance(task, DatasetTask):  # open the data now: a bad path stops here
                task.size("train"), task.size("test")
        except (TypeError, ValueError, FileNotFoundError, ImportError) as e:
            raise ConfigError(f"config section 'task' ({self.name}): {e}") from None
        return task


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    num_examples: int = 512  # held-out prompts for greedy accuracy
    batch_size: int = 128  # prompts per evaluation batch
    every: int = 0  # also evaluate every this many GRPO steps (0 = only after each stage)
    samples: int = 0  # n sampled completions per prompt for pass@k / maj@k (0 = greedy only)
    ks: tuple[int, ...] = (1,)  # k of pass@k and maj@k (each <= samples)
    temperature: float = 1.0  # sampling temperature of the sampled evaluation
    sampled_examples: int = 64  # held-out prompts of the sampled evaluation (the first ones)

    def __post_init__(self):
        if self.samples and not all(1 <= k <= self.samples for k in self.ks):
            raise ValueError(f"eval.ks={list(self.ks)} must lie in 1..eval.samples={self.samples}")
        if self.temperature <= 0:
            raise ValueError(f"eval.temperature must be positive, got {self.temperature}")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    seed: int = 0  # model init and sampling seed
    tokenizer: str = "byt5"  # "byt5" (bytes, no files) or a local HF tokenizer dir (model.hf_path
    # brings its own tokenizer, which replaces this one)
    num_devices: int | None = None  # devices on the "data" mesh axis (None = all)
    checkpoint_every: int = 50  # save every this many steps of each stage
    keep_checkpoints: int = 2  # keep the last this many checkpoints per stage


@dataclasses.dataclass(frozen=True)
class Config:
    task: TaskConfig = TaskConfig()
    model: ModelConfig = ModelConfig()  # model.hf_path starts from a local HF checkpoint
    sft: SFTConfig = SFTConfig()
    grpo: GRPOConfig = GRPOConfig()
    eval: EvalConfig = EvalConfig()
    run: RunConfig = RunConfig()


def _check_lengths(task, tokenizer, cfg, n: int = 256) -> None:
    """Prompts must fit `task.prompt_len` and solutions + EOS `grpo.max_new_tokens`."""
    examples = task.examples("train", 0, n) + task.examples("test", 0, n)
    longest_prompt = max(len(tokenizer.encode(e.prompt)) for e in examples)
    longest_solution = max(len(tokenizer.encode(task.solution(e))) + 1 for e in examples)
    for field, need, have in (("task.prompt_len", longest_prompt, cfg.task.prompt_len),
                              ("grpo.max_new_tokens", longest_solution, cfg.grpo.max_new_tokens)):
        if need > have:
            raise ConfigError(f"config field '{field}' is {have} but this task needs {need} tokens")


def _check_batches(cfg, n_devices: int) -> None:
    """Training batches split evenly over the devices, and GRPO's prompts over the processes.

    (Evaluation rounds its batch to a multiple of the device count itself.)
    """
    rows = {"sft.batch_size": cfg.sft.batch_size,
            "grpo.prompts_per_step": cfg.grpo.prompts_per_step * cfg.grpo.group_size}
    for field, n in rows.items():
        if n % n_devices:
            raise ConfigError(f"config field '{field}' gives {n} rows per batch, which does not "
                              f"divide evenly over {n_devices} devices")
    if cfg.grpo.prompts_per_step % jax.process_count():
        raise ConfigError(f"config field 'grpo.prompts_per_step' must divide by the "
                          f"{jax.process_count()} processes")


def _setup(cfg, task: Task | None = None):
    """Tokenizer, task, mesh, model, initial params and the SFT / GRPO keys of a run.

    The initial params are a fresh init of `cfg.model`, or the weights (and the tokenizer) of the
    local Hugging Face checkpoint `cfg.model.hf_path` when that is set.

    `cfg` needs this module's `task.prompt_len`, `model` (a `ModelConfig`), `sft`, `grpo` and
    `run` fields (other LM experiments reuse it); `task` defaults to the one `cfg.task` names.
    """
    init_key, sft_key, grpo_key = jax.random.split(jax.random.PRNGKey(cfg.run.seed), 3)
    if cfg.model.hf_path:  # a local Hugging Face checkpoint: its sizes, weights and tokenizer
        try:
            model_cfg, params, tokenizer = load_hf_checkpoint(cfg.model.hf_path,
                                                              dtype=cfg.model.dtype)
        except (FileNotFoundError, HFCheckpointError) as e:
            raise ConfigError(f"config field 'model.hf_path': {e}") from None
    else:
        model_cfg, params = cfg.model.lm_config(), None
        tokenizer = load_tokenizer(cfg.run.tokenizer)
    if model_cfg.vocab_size < tokenizer.vocab_size:
        raise ConfigError(
            f"config field 'model.vocab_size' ({model_cfg.vocab_size}) is smaller than the "
            f"tokenizer's vocabulary ({tokenizer.vocab_size})"
        )
    if task is None:
        task = cfg.task.build()
    _check_lengths(task, tokenizer, cfg)
    mesh = make_mesh(cfg.run.num_devices)
    _check_batches(cfg, int(mesh.devices.size))
    model = CausalLM(model_cfg)
    if params is None:
        params = model.init(init_key, jax.numpy.zeros((1, cfg.task.prompt_len), jax.numpy.int32))
    return tokenizer, task, mesh, model, params, sft_key, grpo_key


def run(cfg: Config, opts: RunOptions) -> dict:
    t_start = time.perf_counter()
    tokenizer, task, mesh, model, params, sft_key, grpo_key = _setup(cfg)
    if jax.process_index() == 0:  # what `jaxrl-suite eval RUN_DIR` rebuilds the run from
        write_json(opts.out_dir / "config.json", {"experiment": NAME, "config": to_dict(cfg)})
    common = dict(mesh=mesh, prompt_len=cfg.task.prompt_len)
    ckpt = {
        stage: Checkpointer(
            opts.out_dir / "checkpoints" / stage, save_every=cfg.run.checkpoint_every,
            keep=cfg.run.keep_checkpoints,
        )
        for stage in ("sft", "grpo")
    }
    held_out = task.examples("test", 0, cfg.eval.num_examples)

    # ---- resume: find where the stopped run stood ----
    sft = SFTTrainer(model, tokenizer, task, cfg.sft, max_new_tokens=cfg.grpo.max_new_tokens,
                     **common)
    sft_state, sft_cursor, resume_step = sft.init_state(params, sft_key), 0, None
    grpo_resume = opts.resume and ckpt["grpo"].latest_step() is not None
    if opts.resume:  # when GRPO had started, SFT's final checkpoint is the reference model
        sft_state, sft_meta = ckpt["sft"].restore(sft_state)
        sft_cursor, resume_step = sft_meta["cursor"], int(sft_state.step) + 1
    if grpo_resume:
        grpo = GRPOTrainer(model, tokenizer, task, cfg.grpo, ref_params=sft_state.params,
                           **common)
        state, meta = ckpt["grpo"].restore(grpo.init_state(sft_state.params, grpo_key))
        cursor, sft_eval = meta["cursor"], meta["sft_eval"]
        resume_step = cfg.sft.steps + int(state.step) + 1
    logger = MetricsLogger(opts.out_dir, resume_step=resume_step, tensorboard=opts.tensorboard)

    # ---- SFT ----
    if not grpo_resume:
        sft_state, _ = fit(
            sft, sft_state, stage="sft", num_steps=cfg.sft.steps, cursor=sft_cursor,
            checkpointer=ckpt["sft"], logger=logger, progress=opts.progress,
        )
        sft_eval = sft.evaluate(sft_state.params, held_out, batch_size=cfg.eval.batch_size)
        grpo = GRPOTrainer(model, tokenizer, task, cfg.grpo, ref_params=sft_state.params,
                           **common)
        state, cursor = grpo.init_state(sft_state.params, grpo_key), 0
    t_sft = time.perf_counter() - t_start
    _print(f"[{NAME}] held-out accuracy after SFT:  {sft_eval['accuracy']:.3f}")

    # ---- GRPO ----
    def sampled_eval(params) -> dict:
        if not cfg.eval.samples:
            return {}
        e = cfg.eval
        out = grpo.evaluate_sampled(
            params, held_out[: e.sampled_examples], n=e.samples, ks=e.ks,
            temperature=e.temperature, batch_size=e.batch_size,
            rng=jax.random.PRNGKey(cfg.run.seed + 1),
        )
        return {f"eval_{k}": v for k, v in out.items() if k != "length"}

    def periodic_eval(n, st):
        if cfg.eval.every and n % cfg.eval.every == 0 and n != cfg.grpo.steps:
            return {"eval_accuracy": grpo.evaluate(st.params, held_out,
                                                   batch_size=cfg.eval.batch_size)["accuracy"],
                    **sampled_eval(st.params)}
        return {}

    t_grpo = time.perf_counter()
    state, _ = fit(
        grpo, state, stage="grpo", num_steps=cfg.grpo.steps, cursor=cursor,
        checkpointer=ckpt["grpo"], logger=logger, step_offset=cfg.sft.steps,
        meta={"sft_eval": sft_eval}, progress=opts.progress,
        postfix=("reward", "accuracy", "tokens_per_s"), callback=periodic_eval,
    )
    t_grpo = time.perf_counter() - t_grpo
    grpo_eval = grpo.evaluate(state.params, held_out, batch_size=cfg.eval.batch_size)
    final_sampled = sampled_eval(state.params)
    logger.log({"step": cfg.sft.steps + cfg.grpo.steps, "stage": "final",
                "eval_accuracy": grpo_eval["accuracy"], **final_sampled})
    logger.close()
    for c in ckpt.values():
        c.close()
    _print(f"[{NAME}] held-out accuracy after GRPO: {grpo_eval['accuracy']:.3f}")
    summary = {
        "experiment": NAME,
        "sft_heldout_accuracy": sft_eval["accuracy"],
        "grpo_heldout_accuracy": grpo_eval["accuracy"],
        "gain": grpo_eval["accuracy"] - sft_eval["accuracy"],
        "grpo_sampled_eval": final_sampled,
        "heldout_examples": len(held_out),
        "wall_time_s": time.perf_counter() - t_start,
        "sft_time_s": t_sft,
        "grpo_time_s": t_grpo,
        "devices": int(mesh.devices.size),
        "processes": jax.process_count(),
        "resumed": opts.resume,
        "config": to_dict(cfg),
    }
    if jax.process_index() == 0:  # process 0 writes the files of a multi-host run
        records = [r for r in read_metrics(opts.out_dir / "metrics.jsonl") if r["stage"] == "grpo"]
        plot_curves(records, ["reward", "accuracy", "length"], opts.out_dir / "reward_curve.png",
                    title=f"GRPO on {_task_title(cfg.task)}", smooth=10)
        tps = [r["tokens_per_s"] for r in records[1:]] or [0.0]
        summary["grpo_tokens_per_s_mean"] = sum(tps) / len(tps)
        write_json(opts.out_dir / "summary.json", summary)
    return summary


def evaluate(cfg: Config, opts: EvalOptions) -> dict:
    """`jaxrl-suite eval RUN_DIR`: greedy accuracy and sampled pass@k / maj@k of the latest
    checkpoint of `opts.stage` ("sft" or "grpo"); also written to RUN_DIR/eval_STAGE.json."""
    if opts.stage not in ("sft", "grpo"):
        raise ConfigError(f"eval: --stage must be 'sft' or 'grpo', got {opts.stage!r}")
    tokenizer, task, mesh, model, params, sft_key, grpo_key = _setup(cfg)
    common = dict(mesh=mesh, prompt_len=cfg.task.prompt_len)
    if opts.stage == "sft":
        trainer = SFTTrainer(model, tokenizer, task, cfg.sft,
                             max_new_tokens=cfg.grpo.max_new_tokens, **common)
        template = trainer.init_state(params, sft_key)
    else:
        trainer = GRPOTrainer(model, tokenizer, task, cfg.grpo, ref_params=params, **common)
        template = trainer.init_state(params, grpo_key)
    ckpt = Checkpointer(opts.run_dir / "checkpoints" / opts.stage)
    if ckpt.latest_step() is None:
        raise CheckpointNotFoundError(
            f"eval: no {opts.stage} checkpoint in {opts.run_dir / 'checkpoints' / opts.stage}")
    state, _ = ckpt.restore(template)
    ckpt.close()
    held_out = task.examples("test", 0, opts.num_examples)
    result = {"stage": opts.stage, "step": int(state.step), "examples": len(held_out),
              "samples": opts.samples, "temperature": opts.temperature,
              "greedy_accuracy": trainer.evaluate(state.params, held_out,
                                                  batch_size=cfg.eval.batch_size)["accuracy"]}
    result.update(trainer.evaluate_sampled(
        state.params, held_out, n=opts.samples, ks=opts.ks, temperature=opts.temperature,
        batch_size=cfg.eval.batch_size, rng=jax.random.PRNGKey(cfg.run.seed + 1)))
    if jax.process_index() == 0:
        write_json(opts.run_dir / f"eval_{opts.stage}.json", result)
    return result


def _task_title(task: TaskConfig) -> str:
    return f"{task.digits}-digit addition" if task.name == "arithmetic" else task.name


def _print(text: str) -> None:
    if jax.process_index() == 0:
        print(text, flush=True)


EXPERIMENT = Experiment(
    name=NAME, config_cls=Config, run=run, evaluate=evaluate,
    description="SFT then GRPO on n-digit addition (DeepSeekMath GRPO)",
)

if __name__ == "__main__":
    from jaxrl_suite.cli import main

    sys.exit(main(["run", NAME, *sys.argv[1:]]))
