"""The LM runtime on the host: one fixed-shape batch loop (`map_batches`) and `LMRunner`.

`map_batches` is the library's one loop that runs a jitted computation over a list of host items
(prompts, states, (prompt, completion) pairs) on the mesh: fixed-size batches, the last one padded
with copies of its last item so that one compiled program serves every batch, this process's rows
placed on the mesh by the caller's function, every process's rows gathered back and the padding
trimmed.

`LMRunner` is a causal LM with its tokenizer, task and mesh, and the host plumbing around it that
every LM stage shares: the prompt / completion encoding (`models.sequence.SeqBatch`'s layout),
greedy or sampled completions (`complete`), teacher-forced log-probs of given completions
(`score`), and the held-out evaluations: greedy accuracy (`evaluate`) and pass@k / maj@k of
sampled completions (`evaluate_sampled`), all scored by the task's one entry point
`Task.verify_batch`. The trainers (`algorithms.sft.LMTrainer` and its subclasses) add training.

A vision-language model (`models.vlm.VisionLM`) runs on vision tasks (`envs.vision`): each
example's prompt holds one `IMAGE_MARKER` per scene of `ex.meta.scenes`, which `prompt_inputs`
turns into vision_start, the image's tokens and vision_end, and renders the scenes into the
prompts' `VisionInputs` (per-row image slots, M-RoPE positions), which travel with the prompts
to the sampler and in `SeqBatch.images` to the sequence views.
"""

from __future__ import annotations

import copy
import functools
import zlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from jaxrl_suite.core.parallel import (
    batch_shards,
    gather_rows,
    host_local,
    jit_on_mesh,
    process_rows,
    shard_batch,
)
from jaxrl_suite.envs.vision import IMAGE_MARKER, render_scenes
from jaxrl_suite.losses import token_logprobs
from jaxrl_suite.models.sequence import SeqBatch, completion_logits
from jaxrl_suite.models.sharding import check_model_mesh
from jaxrl_suite.models.vision import image_grid
from jaxrl_suite.models.vlm import VisionInputs, VisionLM, VLMConfig, vision_inputs
from jaxrl_suite.rewards import extract_answer
from jaxrl_suite.sampling.base import Sampler, image_kwargs
from jaxrl_suite.sampling.evaluate import maj_at_k, pass_at_k
from jaxrl_suite.sampling.kv_cache import KVCacheSampler

if TYPE_CHECKING:
    from jaxrl_suite.envs.text import Example, Task
    from jaxrl_suite.envs.text.tokenizer import Tokenizer


def map_batches(fn: Callable[[list, int], Any], items: Sequence, *, batch_size: int,
                mesh) -> Any:
    """`fn` over `items` in fixed-size batches on `mesh`: every output row, in item order.

    The batch size is `batch_size` rounded down to a multiple of the mesh's batch shards
    (`core.parallel.batch_shards`; at least one of them). Batch b holds items [b*B, (b+1)*B),
    the last one padded with copies of its last item, so every call has the same shape (one
    compile). `fn(local_items, b)` gets this process's rows of batch b (`process_rows`; all of
    them on one host), places them (e.g. `shard_batch`) and returns a pytree of arrays whose
    leading axis is the batch's rows: global arrays sharded along it (jax.Array), or host arrays
    of this process's rows. Each leaf's rows of every process are gathered (`host_local`,
    `gather_rows`), the padding rows dropped and the batches concatenated: the result is `fn`'s
    pytree of host arrays with len(items) rows each. Every process passes the same items.
    """
    items = list(items)
    if not items:
        raise ValueError("map_batches needs at least one item")
    n_dev = batch_shards(mesh)
    batch_size = max(n_dev, batch_size - batch_size % n_dev)
    rows = process_rows(batch_size)

    def global_rows(x, n: int) -> np.ndarray:
        local = host_local(x) if isinstance(x, jax.Array) else np.asarray(x)
        return gather_rows(local)[:n]

    outs = []
    for b, start in enumerate(range(0, len(items), batch_size)):
        chunk = items[start : start + batch_size]
        padded = chunk + [chunk[-1]] * (batch_size - len(chunk))  # fixed shape: one compile
        out = fn(padded[rows], b)
        outs.append(jax.tree.map(functools.partial(global_rows, n=len(chunk)), out))
    return jax.tree.map(lambda *xs: np.concatenate(xs), *outs)


def repeat_each(items: Sequence, n: int) -> list:
    """Each item `n` times in a row, item-major ([a, a, b, b] for n = 2): the rows of n samples
    per prompt (a GRPO group, pass@k's samples), so sample j of item i is row i * n + j."""
    return [x for x in items for _ in range(n)]


def image_prompt(tokenizer: Tokenizer, ex: Example, config: VLMConfig
                 ) -> tuple[list[int], np.ndarray]:
    """A vision example's prompt ids and images: each IMAGE_MARKER of `ex.prompt` becomes
    vision_start, t h w / m^2 image tokens and vision_end (Qwen2-VL's layout) for the next scene
    of `ex.meta.scenes`, rendered here (uint8 [n, H, W, 3]; [0, 1, 1, 3] without scenes)."""
    pieces = ex.prompt.split(IMAGE_MARKER)
    scenes = getattr(ex.meta, "scenes", ())
    if len(pieces) - 1 != len(scenes):
        raise ValueError(f"a prompt holds {len(pieces) - 1} {IMAGE_MARKER} markers for "
                         f"{len(scenes)} scenes: {ex.prompt[:40]!r}")
    rendered = render_scenes(scenes) if scenes else np.zeros((0, 1, 1, 3), np.uint8)
    ids = tokenizer.encode(pieces[0])
    for image, piece in zip(rendered, pieces[1:], strict=True):
        t, h, w = image_grid(*image.shape[:2], config.vision)
        ids += [config.vision_start_id, *[config.image_token_id] * (
            t * h * w // config.vision.merge_tokens), config.vision_end_id]
        ids += tokenizer.encode(piece)
    return ids, rendered


def answer_id(text: str) -> int:
    """A stable integer id of a completion's parsed answer (-1: none), for voting across hosts."""
    answer = extract_answer(text)
    if answer is None:
        return -1
    return zlib.crc32(answer.encode(errors="surrogatepass")) & 0x7FFFFFFF  # lone surrogates too


class LMRunner:
    """A causal LM's host-side runtime: task, tokenizer, mesh, completion, scoring, evaluation.

    Sequences follow `SeqBatch`'s layout: prompts left-padded to `prompt_len` tokens,
    completions right-padded to `max_new_tokens`. The runner owns its evaluation samplers
    (`sampling.Sampler`s): `greedy_sampler` decodes greedy completions (`complete` without a
    key, `evaluate`), and `eval_sampler` draws sampled ones (`complete` with a key,
    `evaluate_sampled`) at the temperature and top_p of each call (traced: no recompile). They
    default to `KVCacheSampler`s of max_new_tokens tokens (greedy; top_k off); pass another
    runner's to share its compiled program. A `VisionLM` also reads the prompts' images (module
    docstring): `max_images` image slots per row (default: the task's `max_images`, else 1).
    """

    def __init__(
        self, model, tokenizer: Tokenizer, task: Task, *, mesh, prompt_len: int,
        max_new_tokens: int, greedy_sampler: Sampler | None = None,
        eval_sampler: Sampler | None = None, max_images: int | None = None,
    ):
        check_model_mesh(model.config, mesh)
        self.model, self.tokenizer, self.task, self.mesh = model, tokenizer, task, mesh
        self.prompt_len, self.max_new_tokens = prompt_len, max_new_tokens
        self.max_images = max_images or getattr(task, "max_images", 1)
        ids = dict(max_new_tokens=max_new_tokens, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id)
        self.greedy_sampler = greedy_sampler or KVCacheSampler(model, greedy=True, **ids)
        self.eval_sampler = eval_sampler or KVCacheSampler(model, **ids)

    # ---- encoding ----
    def encode_prompts(self, examples: Sequence[Example]) -> tuple[np.ndarray, np.ndarray]:
        """The examples' prompts, left-padded to prompt_len: host (ids [n, P], mask [n, P])
        (a vision-language model's with their image tokens: `prompt_inputs`)."""
        if not isinstance(self.model, VisionLM):
            return self.tokenizer.encode_batch([e.prompt for e in examples], self.prompt_len)
        return self.prompt_inputs(examples)[:2]

    def prompt_inputs(self, examples: Sequence[Example]
                      ) -> tuple[np.ndarray, np.ndarray, VisionInputs | None]:
        """Host (ids [n, P], mask [n, P], images): `encode_prompts` and, for a `VisionLM`, the
        prompts' `VisionInputs` (None for a text model or a batch without images). Each
        IMAGE_MARKER of a prompt becomes vision_start, t h w / m^2 image tokens and vision_end
        (Qwen2-VL's layout) for the next scene of `ex.meta.scenes`, rendered on the host."""
        if not isinstance(self.model, VisionLM):
            return (*self.encode_prompts(examples), None)
        cfg = self.model.config
        ids = np.full((len(examples), self.prompt_len), self.tokenizer.pad_id, np.int32)
        mask = np.zeros(ids.shape, bool)
        images = []
        for row, ex in enumerate(examples):
            row_ids, rendered = image_prompt(self.tokenizer, ex, cfg)
            if len(row_ids) > self.prompt_len:
                raise ValueError(f"prompt {row} needs {len(row_ids)} tokens with its images, "
                                 f"more than prompt_len={self.prompt_len}: {ex.prompt[:40]!r}")
            ids[row, self.prompt_len - len(row_ids):] = row_ids
            mask[row, self.prompt_len - len(row_ids):] = True
            images.append(rendered)
        if not any(len(x) for x in images):
            return ids, mask, None
        return ids, mask, vision_inputs(images, ids, mask, cfg, max_images=self.max_images)

    def encode_completions(self, texts: Sequence[str], *, eos: bool = True
                           ) -> tuple[np.ndarray, np.ndarray]:
        """Completion texts + EOS, right-padded to max_new_tokens: host (ids [n, N], float32
        mask [n, N]). With `eos=False`, the texts as they are, each cut to its first
        max_new_tokens tokens (e.g. a text's steps scored as the sampler could have made them)."""
        if eos:
            ids, mask = self.tokenizer.encode_batch(list(texts), self.max_new_tokens,
                                                    side="right", add_eos=True)
            return ids, mask.astype(np.float32)
        ids = np.full((len(texts), self.max_new_tokens), self.tokenizer.pad_id, np.int32)
        mask = np.zeros((len(texts), self.max_new_tokens), np.float32)
        for row, text in enumerate(texts):
            x = self.tokenizer.encode(text)[: self.max_new_tokens]
            ids[row, : len(x)] = x
            mask[row, : len(x)] = 1.0
        return ids, mask

    def encode_solutions(self, examples: Sequence[Example]) -> tuple[np.ndarray, np.ndarray]:
        """`encode_completions` of the examples' task solutions."""
        return self.encode_completions([self.task.solution(e) for e in examples])

    def solution_batch(self, examples: Sequence[Example]) -> SeqBatch:
        """Host arrays of `examples` with their task solutions as completions (the SFT data)."""
        ids, mask, images = self.prompt_inputs(examples)
        return SeqBatch(ids, mask, *self.encode_solutions(examples), images=images)

    def with_task(self, task: Task) -> LMRunner:
        """This runner on another task (e.g. a data filter's `ExampleList`), sharing its
        compiled programs, samplers and config: a shallow copy."""
        other = copy.copy(self)
        other.task = task
        return other

    # ---- completion and scoring ----
    def complete(self, params, examples: Sequence[Example], *, batch_size: int,
                 rng: jax.Array | None = None, temperature: float | None = None,
                 top_p: float | None = None) -> tuple[list[str], np.ndarray]:
        """One completion of every example (all processes' rows, in order): (texts, lengths
        [len(examples)]), in fixed-size batches of about `batch_size` rows (`map_batches`).

        Without `rng`: greedy (`greedy_sampler`, key PRNGKey(0)). With `rng`: sampled by
        `eval_sampler` at `temperature` / `top_p` (default 1.0), batch b with key
        fold_in(rng, b); repeat an example for several samples of it."""
        if rng is None:
            if temperature is not None or top_p is not None:
                raise ValueError("complete: temperature and top_p need an rng (sampling)")

            def sample(prompt, mask, b, **images):
                return self.greedy_sampler(params, prompt, mask, jax.random.PRNGKey(0), **images)
        else:
            settings = dict(temperature=1.0 if temperature is None else temperature,
                            top_p=1.0 if top_p is None else top_p)

            def sample(prompt, mask, b, **images):
                return self.eval_sampler(params, prompt, mask, jax.random.fold_in(rng, b),
                                         **settings, **images)

        def run(local, b):
            ids, mask, images = shard_batch(self.prompt_inputs(local), self.mesh)
            out = sample(ids, mask, b, **image_kwargs(images))
            return out.tokens, out.mask

        tokens, mask = map_batches(run, examples, batch_size=batch_size, mesh=self.mesh)
        return self.tokenizer.decode_batch(tokens, mask), mask.sum(axis=1)

    def score(self, params, examples: Sequence[Example], completions: Sequence[str] | None = None,
              *, logprob_fn: Callable | None = None, batch_size: int | None = None,
              eos: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Teacher-forced log-probs of `completions` (default: each example's task solution)
        + EOS after the examples' prompts under `params`: host (logp [n, N], mask [n, N]; logp
        means nothing where mask is 0). `logprob_fn(params, seq)` gives a placed `SeqBatch`'s
        completion log-probs [rows, N] (default: the causal model's exact ones at temperature 1,
        one jitted program per runner; a GRPO trainer's `completion_logprobs` takes its sampling
        temperature and micro-batches). Rows run
        `batch_size` at a time (`map_batches`; default: all in one batch, padded to a multiple
        of the batch shards). With the default completions, -logp * mask is the solutions'
        per-token NLL (the SFT loss's terms). `eos=False` scores the completions without an EOS,
        each cut to max_new_tokens tokens (`encode_completions`)."""
        texts = [self.task.solution(e) for e in examples] if completions is None else \
            list(completions)
        if len(texts) != len(examples):
            raise ValueError(f"{len(texts)} completions for {len(examples)} examples")
        if batch_size is None:
            batch_size = len(examples) + (-len(examples) % batch_shards(self.mesh))
        logprob_fn = logprob_fn or self._causal_logprobs

        def run(local, b):
            ex, tx = zip(*local, strict=True)
            ids, mask, images = self.prompt_inputs(ex)
            seq = shard_batch(SeqBatch(ids, mask, *self.encode_completions(tx, eos=eos),
                                       images=images), self.mesh)
            return logprob_fn(params, seq), seq.completion_mask

        return map_batches(run, list(zip(examples, texts, strict=True)), batch_size=batch_size,
                           mesh=self.mesh)

    @functools.cached_property
    def _causal_logprobs(self) -> Callable:
        model = self.model
        return jit_on_mesh(lambda p, seq: token_logprobs(completion_logits(model, p, seq),
                                                         seq.completion))

    # ---- evaluation ----
    def evaluate(self, params, examples: Sequence[Example], *, batch_size: int) -> dict:
        """Greedy held-out accuracy: fraction of `examples` whose completion scores 1; the mean
        completion length, and the mean "reward": the task's designed reward
        (`Verdicts.rewards`) where it has one, else the score."""
        texts, lengths = self.complete(params, examples, batch_size=batch_size)
        verdicts = self.task.verify_batch(texts, examples)
        correct = [s == 1.0 for s in verdicts.scores]
        rewards = verdicts.scores if verdicts.rewards is None else verdicts.rewards
        return {"accuracy": float(np.mean(correct)), "length": float(lengths.mean()),
                "reward": float(np.mean(rewards))}

    def evaluate_sampled(
        self, params, examples: Sequence[Example], *, n: int, ks: Sequence[int],
        temperature: float, top_p: float = 1.0, batch_size: int, rng: jax.Array,
    ) -> dict:
        """n sampled completions per example: unbiased pass@k and maj@k for each k in `ks`.

        Rows are the examples repeated n times, sampled in fixed-size batches (one compile).
        Returns {"pass@k": ..., "maj@k": ... for k in ks, "length": mean completion length}.
        maj@k votes over the parsed answers of the first k samples (`sampling.evaluate`).
        """
        bad = [k for k in ks if not 1 <= k <= n]
        if bad:
            raise ValueError(f"eval ks={list(ks)} must lie in 1..n={n} (samples per prompt)")
        flat = repeat_each(examples, n)
        texts, lengths = self.complete(params, flat, batch_size=batch_size, rng=rng,
                                       temperature=temperature, top_p=top_p)
        scores = self.task.verify_batch(texts, flat).scores
        stats = np.array([[s == 1.0, m, answer_id(t)]  # per sample: correct, length, answer
                          for s, t, m in zip(scores, texts, lengths, strict=True)], np.int64)
        stats = stats.reshape(len(examples), n, 3)
        correct, answers = stats[..., 0], stats[..., 2]
        # Samples with the same parsed answer to the same prompt are equally correct.
        verdict = [{int(a): bool(c) for a, c in zip(ans, cor, strict=True)}
                   for ans, cor in zip(answers, correct, strict=True)]
        votes = [[None if a < 0 else int(a) for a in row] for row in answers]
        result = {"length": float(stats[..., 1].mean())}
        for k in ks:
            result[f"pass@{k}"] = float(pass_at_k(n, correct.sum(axis=1), k).mean())
            result[f"maj@{k}"] = float(maj_at_k(votes, k, lambda i, a: verdict[i][a]).mean())
        return result


__all__ = ["LMRunner", "answer_id", "image_prompt", "map_batches", "repeat_each"]
