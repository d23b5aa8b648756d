"""Weak-to-strong training: a weak supervisor, a pretrained strong student, binary classifiers.

Burns et al. 2023, "Weak-to-Strong Generalization: Eliciting Strong Capabilities With Weak
Supervision", arXiv:2312.09390. Pieces, each one jitted program with the seeds vmapped:

  data      `make_data`: a binary task's texts as fixed-length byte-token arrays, split into an
            unlabelled pretraining corpus, half A (the weak model's labelled training set),
            half B (the weak model labels it, the students train on those labels) and a test set
            (the task's test split). `BINARY_VIEWS` maps a task name to its (text, label) view.
  pretrain  `make_pretrain`: next-token NLL on the corpus texts, S minibatch AdamW steps in one
            `lax.scan` -> params (the strong student learns the task's text without labels).
  classify  `classifier_logits`: a `CausalLM` read as a 2-way classifier. The input is
            text + `SUFFIX`, left-padded so the suffix ends at position T-1; the class logits
            are the LM's own next-token logits at T-1 of the label bytes "0" and "1":

                z_b = [logits_{b, T-1, id("0")}, logits_{b, T-1, id("1")}]      [B, 2]

            No new head: the pretrained LM's output layer (the tied embedding) scores the labels,
            so a student starts from what pretraining put there and nothing is initialised at
            random at fine-tuning time (the authors add a zero-initialised linear head instead).
  train     `make_train(config, loss_name)`: fine-tunes on targets [N, 2] (one-hot true labels,
            or the weak model's soft labels) with a `losses.w2s.W2S_LOSSES` loss, step_frac =
            step / steps fed to it (the logconf ramp), -> (params, per-step metrics).
  evaluate  `predict_proba` [N, 2] and `accuracy`; the weak labels of half B are the weak
            model's probabilities there (`weak_labels`).

`performance_gap_recovered` (losses.w2s) turns the accuracies into PGR.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxrl_suite.core.config import (
    Count,
    NonNegative,
    NonNegativeInt,
    Positive,
    Probability,
    check_fields,
)
from jaxrl_suite.core.registry import Registry
from jaxrl_suite.core.train import apply_gradients, init_param_state, make_optimizer
from jaxrl_suite.envs.text.base import Example, Task
from jaxrl_suite.envs.text.tokenizer import Tokenizer
from jaxrl_suite.losses.w2s import W2S_LOSSES
from jaxrl_suite.models.lm import CausalLM, LMConfig, output_projection

SUFFIX = "\nlabel: "  # appended to every text; the class is the next byte, "0" or "1"
LABEL_TEXTS = ("0", "1")  # the label bytes of class 0 and class 1

# task name -> fn(task, example) -> (text, label in {0, 1})
BINARY_VIEWS: Registry[Callable[[Task, Example], tuple[str, int]]] = Registry("w2s binary view")


@BINARY_VIEWS.register("screening")
def _screening_view(task: Task, ex: Example) -> tuple[str, int]:
    """The résumé / job pair; 1 = SELECTED."""
    return ex.prompt.rstrip("\n"), int(ex.answer == "SELECTED")


@BINARY_VIEWS.register("topics")
def _topics_view(task: Task, ex: Example) -> tuple[str, int]:
    """The raw sentence; binarised: 1 = the agent's topic is among the last three (politics,
    health, travel), 0 = sports, finance, science."""
    label, names = ex.meta[0], ex.meta[1]
    return ex.meta[2], int(label >= len(names) // 2)


@BINARY_VIEWS.register("dialects")
def _dialects_view(task: Task, ex: Example) -> tuple[str, int]:
    """The sentence; 1 = dialect "B"."""
    return ex.prompt, int(ex.answer == "B")


@dataclasses.dataclass(frozen=True)
class PretrainConfig:
    steps: Count = 500  # AdamW steps of next-token prediction on the corpus
    batch_size: Count = 32  # texts per step (sampled with replacement)
    lr: Positive = 2e-3  # peak learning rate (warm-up then cosine decay to lr / 10)
    warmup: NonNegativeInt = 50  # warm-up steps (< steps)
    weight_decay: NonNegative = 0.01  # AdamW weight decay

    def __post_init__(self):
        check_fields(self, "pretrain.")  # the Ranges declared above
        _check_warmup(self, "pretrain")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    steps: Count = 300  # AdamW steps of classifier fine-tuning
    batch_size: Count = 32  # rows per step (sampled with replacement)
    lr: Positive = 1e-3  # peak learning rate (warm-up then cosine decay to lr / 10)
    warmup: NonNegativeInt = 20  # warm-up steps (< steps)
    weight_decay: NonNegative = 0.01  # AdamW weight decay

    def __post_init__(self):
        check_fields(self, "train.")  # the Ranges declared above (the weak / strong sections)
        _check_warmup(self, "train")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    seq_len: Count = 120  # tokens per row (bytes of text + suffix, left-padded)
    n_a: Count = 512  # half A: the weak model's labelled training rows
    n_b: Count = 1024  # half B: weak-labelled for the students (true labels: the ceiling)
    n_corpus: Count = 4000  # unlabelled texts of the strong model's pretraining
    n_test: Count = 512  # test-split rows every accuracy is measured on

    def __post_init__(self):
        check_fields(self, "data.")  # the Ranges declared above (a task's data section)


@dataclasses.dataclass(frozen=True)
class LossConfig:
    aux_coef: Probability = 0.5  # logconf: final weight of the student's hardened predictions
    warmup_frac: NonNegative = 0.1  # logconf: share of training over which the weight ramps up
    ramp: str = "authors"  # "authors" (their code: a jump at warmup_frac) or "linear"

    def __post_init__(self):
        check_fields(self, "loss.")  # the Ranges declared above
        if self.ramp not in ("authors", "linear"):
            raise ValueError(f"loss.ramp must be 'authors' or 'linear', got {self.ramp!r}")


def _check_warmup(cfg, prefix: str) -> None:
    if not cfg.warmup < cfg.steps:
        raise ValueError(f"{prefix}.warmup must be < {prefix}.steps ({cfg.steps}), got "
                         f"{cfg.warmup}")


def _optimizer(cfg) -> optax.GradientTransformation:
    return make_optimizer(cfg.lr, warmup_steps=cfg.warmup, total_steps=cfg.steps,
                          weight_decay=cfg.weight_decay)


# -- data ----------------------------------------------------------------------------------------


class Split(NamedTuple):
    """Token arrays of one split: tokens [N, T] int32 (left-padded), mask [N, T] bool, labels
    [N] int32 (-1 for the unlabelled corpus)."""

    tokens: np.ndarray
    mask: np.ndarray
    labels: np.ndarray


class W2SData(NamedTuple):
    """The four splits (`make_data`). `corpus` holds the texts alone (+ EOS, no suffix, no
    label); the others text + `SUFFIX`."""

    corpus: Split
    half_a: Split
    half_b: Split
    test: Split


def label_token_ids(tokenizer: Tokenizer) -> tuple[int, int]:
    """The token ids of the label bytes "0" and "1"."""
    ids = tuple(tokenizer.encode(t) for t in LABEL_TEXTS)
    if any(len(i) != 1 for i in ids):
        raise ValueError(f"each label text must be one token, got {ids}")
    return ids[0][0], ids[1][0]


def encode_split(tokenizer: Tokenizer, texts: Sequence[str], labels: Sequence[int], length: int,
                 *, corpus: bool = False) -> Split:
    """Left-padded tokens of `texts` (+ EOS for the corpus, + `SUFFIX` otherwise)."""
    if corpus:
        tokens, mask = tokenizer.encode_batch(list(texts), length, side="left", add_eos=True)
    else:
        tokens, mask = tokenizer.encode_batch([t + SUFFIX for t in texts], length, side="left")
    return Split(tokens, mask, np.asarray(labels, np.int32))


def make_data(task: Task, tokenizer: Tokenizer, length: int, *, n_corpus: int, n_a: int,
              n_b: int, n_test: int, view: str | None = None) -> W2SData:
    """Disjoint splits of `task`'s train split (indices 0..n_a-1 half A, then n_b for half B,
    then n_corpus corpus texts) and its first n_test test examples, viewed through
    `BINARY_VIEWS[view or task.name]` and encoded to `length` tokens."""
    for name, n in (("n_corpus", n_corpus), ("n_a", n_a), ("n_b", n_b), ("n_test", n_test)):
        if n < 1:
            raise ValueError(f"make_data: {name} must be >= 1, got {n}")
    fn = BINARY_VIEWS.get(view or task.name)
    pairs = [fn(task, ex) for ex in task.examples("train", 0, n_a + n_b + n_corpus)]
    test = [fn(task, ex) for ex in task.examples("test", 0, n_test)]

    def split(rows, corpus=False):
        texts, labels = zip(*rows, strict=True)
        return encode_split(tokenizer, texts, labels if not corpus else [-1] * len(rows),
                            length, corpus=corpus)

    return W2SData(corpus=split(pairs[n_a + n_b:], corpus=True), half_a=split(pairs[:n_a]),
                   half_b=split(pairs[n_a:n_a + n_b]), test=split(test))


def one_hot_targets(labels) -> np.ndarray:
    """[N] labels in {0, 1} -> [N, 2] float32 one-hot targets."""
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.isin(labels, (0, 1)).all():
        raise ValueError(f"labels must be a [N] array of 0 / 1, got shape {labels.shape}")
    return np.eye(2, dtype=np.float32)[labels]


# -- model ---------------------------------------------------------------------------------------


def init_params(config: LMConfig, rng: chex.PRNGKey, length: int):
    """Fresh `CausalLM` params (vmappable over rng)."""
    return CausalLM(config).init(rng, jnp.zeros((1, length), jnp.int32))


def classifier_logits(config: LMConfig, params, tokens: chex.Array, mask: chex.Array,
                      label_ids: tuple[int, int]) -> chex.Array:
    """z [B, 2]: the LM's next-token logits at the last position T-1 of the label tokens
    (module docstring). tokens, mask [B, T], left-padded, the suffix ending at T-1."""
    chex.assert_rank([tokens, mask], 2)
    _, _, h = CausalLM(config).apply(params, tokens, key_mask=mask, return_hidden=True,
                                     return_logits=False)  # h [B, T, D]
    w, transposed = output_projection(params, config)  # [V, D] tied, else [D, V]
    w = w[jnp.asarray(label_ids)] if transposed else w[:, jnp.asarray(label_ids)].T  # [2, D]
    h_last = h[:, -1].astype(jnp.float32)  # [B, D]
    return h_last @ w.astype(jnp.float32).T  # [B, 2]


def lm_nll(config: LMConfig, params, tokens: chex.Array, mask: chex.Array) -> chex.Array:
    """Mean next-token NLL over the real (mask) positions whose previous token is real too.
    tokens, mask [B, T]."""
    logits, _ = CausalLM(config).apply(params, tokens, key_mask=mask)  # [B, T, V]
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)  # [B, T-1, V]
    nll = -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]  # [B, T-1]
    w = (mask[:, 1:] & mask[:, :-1]).astype(jnp.float32)  # [B, T-1]
    return jnp.sum(nll * w) / jnp.maximum(jnp.sum(w), 1.0)


# -- training ------------------------------------------------------------------------------------


def _fit(opt: optax.GradientTransformation, steps: int, batch_size: int, loss_fn, params,
         rng, n_rows):
    """`steps` AdamW updates of loss_fn(params, idx [B], step_frac) on minibatches of rows
    sampled with replacement from 0..n_rows-1, one `lax.scan`. Returns (params, metrics
    [steps])."""
    state = init_param_state(params, opt)

    def update(state, step):
        idx = jax.random.randint(jax.random.fold_in(rng, step), (batch_size,), 0, n_rows)
        frac = step.astype(jnp.float32) / steps
        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, idx,
                                                                           frac)
        state, norms = apply_gradients(state, grads, opt, loss=loss, keep="params")
        return state, {**metrics, "loss": loss, **norms}

    state, metrics = jax.lax.scan(update, state, jnp.arange(steps, dtype=jnp.int32))
    return state.params, metrics


def make_pretrain(config: PretrainConfig, lm: LMConfig):
    """`pretrain(rng, tokens [N, T], mask [N, T]) -> (params, metrics [steps])`: fresh params
    from rng, then `config.steps` AdamW steps of `lm_nll` on random corpus rows. Pure;
    jit it (vmappable over rng, the corpus with in_axes None)."""
    opt = _optimizer(config)

    def pretrain(rng, tokens, mask):
        k_init, k_fit = jax.random.split(rng)
        params = init_params(lm, k_init, tokens.shape[1])

        def loss_fn(p, idx, frac):
            return lm_nll(lm, p, tokens[idx], mask[idx]), {}

        return _fit(opt, config.steps, config.batch_size, loss_fn, params, k_fit,
                    tokens.shape[0])

    return pretrain


def make_train(config: TrainConfig, lm: LMConfig, loss_name: str,
               label_ids: tuple[int, int], **loss_kw: Any):
    """`train(rng, params0, tokens [N, T], mask [N, T], targets [N, 2]) -> (params, metrics
    [steps])`: `config.steps` AdamW steps of W2S_LOSSES[loss_name](z, targets[idx], step /
    steps, **loss_kw) on minibatches of random rows, z = `classifier_logits`. Pure; jit it.
    Under `jax.vmap` over rng (and params0 per seed, or shared with in_axes None) it is a
    seed sweep; the data go in as arguments (in_axes None), never closed over.

    metrics: the loss's metrics plus grad_norm, param_norm, update_norm and finite per step."""
    loss = W2S_LOSSES.get(loss_name)
    opt = _optimizer(config)

    def train(rng, params0, tokens, mask, targets):
        chex.assert_shape(targets, (tokens.shape[0], 2))

        def loss_fn(p, idx, frac):
            z = classifier_logits(lm, p, tokens[idx], mask[idx], label_ids)
            return loss(z, targets[idx], frac, **loss_kw)

        return _fit(opt, config.steps, config.batch_size, loss_fn, params0, rng,
                    tokens.shape[0])

    return train


def predict_proba(lm: LMConfig, params, tokens: chex.Array, mask: chex.Array,
                  label_ids: tuple[int, int], batch_size: int = 256) -> chex.Array:
    """softmax(z) [N, 2] over the rows, `batch_size` at a time (one `lax.map`; the rows are
    padded to a multiple of it). Traceable: jit / vmap it over params."""
    n, t = tokens.shape
    bs = min(batch_size, n)
    pad = -n % bs
    tok = jnp.pad(tokens, ((0, pad), (0, 0))).reshape(-1, bs, t)
    msk = jnp.pad(mask, ((0, pad), (0, 0)), constant_values=True).reshape(-1, bs, t)
    z = jax.lax.map(lambda b: classifier_logits(lm, params, b[0], b[1], label_ids), (tok, msk))
    return jax.nn.softmax(z.reshape(-1, 2)[:n], axis=-1)


def accuracy(probs, labels) -> np.ndarray:
    """Share of rows whose argmax is the label: probs [..., N, 2], labels [N] -> [...]."""
    probs, labels = np.asarray(probs), np.asarray(labels)
    return (probs.argmax(-1) == labels).mean(-1)


def weak_labels(lm: LMConfig, weak_params, half_b: Split, label_ids: tuple[int, int],
                batch_size: int = 256) -> chex.Array:
    """The weak supervisor's soft labels of half B: its probabilities there [N_B, 2] (the
    students never see half B's true labels)."""
    return predict_proba(lm, weak_params, jnp.asarray(half_b.tokens), jnp.asarray(half_b.mask),
                         label_ids, batch_size)


def parse_pair(pair: str) -> tuple[str, str]:
    """"WEAK:STRONG" (two `parse_size` sizes, e.g. "1x32:2x64") -> (weak, strong); a malformed
    pair is a one-line ValueError naming run.pairs."""
    parts = pair.split(":")
    try:
        if len(parts) != 2:
            raise ValueError(pair)
        for p in parts:
            parse_size(p, 8)
    except ValueError:
        raise ValueError(f"run.pairs: {pair!r} is not 'WEAK:STRONG' with sizes 'LAYERSxWIDTH' "
                         "(e.g. '1x32:2x64')") from None
    return parts[0], parts[1]


def parse_size(size: str, max_len: int) -> LMConfig:
    """"LxD" (layers x width, e.g. "2x64") -> an LMConfig with head width 16 (D // 16 heads,
    at least 2), d_ff = 4 D and max_len."""
    try:
        layers, width = (int(x) for x in size.split("x"))
    except ValueError:
        raise ValueError(f"model size must be 'LAYERSxWIDTH', e.g. '2x64', got {size!r}"
                         ) from None
    if layers < 1 or width < 8 or width % 8:
        raise ValueError(f"model size {size!r}: need >= 1 layer and a width that is a positive "
                         "multiple of 8")
    heads = max(2, width // 16)
    return LMConfig(d_model=width, n_layers=layers, n_heads=heads, n_kv_heads=heads,
                    d_ff=4 * width, max_len=max_len)


__all__ = [
    "BINARY_VIEWS",
    "LABEL_TEXTS",
    "SUFFIX",
    "DataConfig",
    "LossConfig",
    "PretrainConfig",
    "Split",
    "TrainConfig",
    "W2SData",
    "accuracy",
    "classifier_logits",
    "encode_split",
    "init_params",
    "label_token_ids",
    "lm_nll",
    "make_data",
    "make_pretrain",
    "make_train",
    "one_hot_targets",
    "parse_pair",
    "parse_size",
    "predict_proba",
    "weak_labels",
]
