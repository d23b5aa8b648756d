"""algorithms/w2s.py: the classifier against a direct CausalLM forward, training lowers the loss
on a separable toy set, vmap over seeds equals single runs, pretraining lowers the NLL, the data
splits and the weak-label pipeline, and the one-line errors. Tiny shapes, compiled once per
module."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_suite.algorithms import w2s
from jaxrl_suite.envs.text import load_tokenizer, make_task
from jaxrl_suite.models.lm import CausalLM

T = 16  # tokens per row
LM = w2s.parse_size("1x16", T)
CFG = w2s.TrainConfig(steps=30, batch_size=8, lr=1e-2, warmup=2)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


@pytest.fixture(scope="module")
def ids(tok):
    return w2s.label_token_ids(tok)


@pytest.fixture(scope="module")
def toy(tok):
    """A separable set: 16 rows, "xx..." (class 0) or "yy..." (class 1) of varied lengths."""
    texts = [("x" if i % 2 == 0 else "y") * (3 + i % 5) for i in range(16)]
    labels = [i % 2 for i in range(16)]
    return w2s.encode_split(tok, texts, labels, T)


@pytest.fixture(scope="module")
def trained(toy, ids):
    """train vmapped over 2 seeds (params per seed) and each seed alone: one program each."""
    train = w2s.make_train(CFG, LM, "xent", ids)
    keys = jnp.stack([jax.random.key(0), jax.random.key(1)])
    p0 = jax.vmap(lambda k: w2s.init_params(LM, k, T))(keys)
    targets = w2s.one_hot_targets(toy.labels)
    batched = jax.jit(jax.vmap(train, in_axes=(0, 0, None, None, None)))(
        keys, p0, toy.tokens, toy.mask, targets)
    single = jax.jit(train)
    singles = [single(keys[i], jax.tree.map(lambda x, i=i: x[i], p0), toy.tokens, toy.mask,
                      targets) for i in range(2)]
    return p0, batched, singles


def test_classifier_logits_are_the_lm_logits_of_the_label_bytes(toy, ids, tok):
    assert ids == (tok.encode("0")[0], tok.encode("1")[0])
    params = w2s.init_params(LM, jax.random.key(3), T)
    z = w2s.classifier_logits(LM, params, toy.tokens, toy.mask, ids)
    logits, _ = CausalLM(LM).apply(params, toy.tokens, key_mask=toy.mask)  # [B, T, V]
    assert z.shape == (16, 2)
    np.testing.assert_allclose(z, logits[:, -1, list(ids)], rtol=1e-5, atol=1e-5)
    # the rows end with the suffix at T-1 (left padding)
    assert tok.decode(toy.tokens[0][toy.mask[0]]).endswith(w2s.SUFFIX)


def test_training_lowers_the_loss_and_separates_the_toy_set(trained, toy, ids):
    _, (params, metrics), _ = trained
    loss = np.asarray(metrics["loss"])  # [2, steps]
    assert loss.shape == (2, CFG.steps)
    assert (loss[:, -5:].mean(1) < 0.5 * loss[:, :5].mean(1)).all()
    for k in ("grad_norm", "param_norm", "update_norm", "student_agreement"):
        assert metrics[k].shape == (2, CFG.steps)
    probs = jax.vmap(lambda p: w2s.predict_proba(LM, p, toy.tokens, toy.mask, ids,
                                                 batch_size=5))(params)  # rows padded 16 -> 20
    assert probs.shape == (2, 16, 2)
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(w2s.accuracy(probs, toy.labels), [1.0, 1.0])


def test_vmap_over_seeds_equals_single_runs(trained):
    _, (params, metrics), singles = trained
    for i, (p, m) in enumerate(singles):
        np.testing.assert_allclose(m["loss"], metrics["loss"][i], rtol=1e-4, atol=1e-5)
        jax.tree.map(lambda a, b, i=i: np.testing.assert_allclose(a, b[i], rtol=1e-4,
                                                                  atol=1e-5), p, params)
    assert not np.allclose(metrics["loss"][0], metrics["loss"][1])  # the seeds differ


def test_logconf_student_gets_the_step_fraction(toy, ids):
    cfg = w2s.TrainConfig(steps=10, batch_size=4, lr=1e-3, warmup=0)
    train = jax.jit(w2s.make_train(cfg, LM, "logconf", ids, aux_coef=0.5, warmup_frac=1.0,
                                   ramp="linear"))
    params = w2s.init_params(LM, jax.random.key(0), T)
    _, m = train(jax.random.key(1), params, toy.tokens, toy.mask,
                 w2s.one_hot_targets(toy.labels))
    np.testing.assert_allclose(m["aux_coef"], 0.5 * np.arange(10) / 10, rtol=1e-6)


def test_pretraining_lowers_the_next_token_nll(tok):
    texts = ["the cat sat on the mat", "the dog sat on the log"] * 8
    corpus = w2s.encode_split(tok, texts, [-1] * 16, T + 8, corpus=True)
    assert (corpus.tokens[corpus.mask][-1:] == tok.eos_id).all()  # text + EOS, no suffix
    lm = w2s.parse_size("1x16", T + 8)
    pre = jax.jit(w2s.make_pretrain(w2s.PretrainConfig(steps=40, batch_size=8, lr=1e-2,
                                                       warmup=2), lm))
    params, m = pre(jax.random.key(0), corpus.tokens, corpus.mask)
    assert m["loss"].shape == (40,)
    assert float(m["loss"][-5:].mean()) < 0.6 * float(m["loss"][:5].mean())
    # the NLL is over real next tokens only: padding changes nothing
    nll = w2s.lm_nll(lm, params, corpus.tokens[:2], corpus.mask[:2])
    wider = w2s.encode_split(tok, texts[:2], [-1] * 2, T + 8 + 4, corpus=True)
    lm_wide = w2s.parse_size("1x16", T + 12)
    np.testing.assert_allclose(w2s.lm_nll(lm_wide, params, wider.tokens, wider.mask), nll,
                               rtol=1e-4)


def test_data_splits_and_weak_labels_of_half_b(tok, ids):
    task = make_task("dialects")
    data = w2s.make_data(task, tok, 40, n_corpus=6, n_a=4, n_b=5, n_test=3)
    assert [len(s.labels) for s in data] == [6, 4, 5, 3]
    assert (data.corpus.labels == -1).all()
    train = task.examples("train", 0, 15)
    view = lambda ex: w2s.BINARY_VIEWS.get("dialects")(task, ex)  # noqa: E731
    decoded = lambda s: [tok.decode(r[m]) for r, m in zip(s.tokens, s.mask, strict=True)]  # noqa: E731
    assert decoded(data.half_a) == [view(e)[0] + w2s.SUFFIX for e in train[:4]]
    assert decoded(data.half_b) == [view(e)[0] + w2s.SUFFIX for e in train[4:9]]
    assert decoded(data.corpus) == [view(e)[0] for e in train[9:]]
    np.testing.assert_array_equal(data.half_b.labels, [view(e)[1] for e in train[4:9]])
    lm = w2s.parse_size("1x16", 40)
    weak = w2s.init_params(lm, jax.random.key(5), 40)
    soft = w2s.weak_labels(lm, weak, data.half_b, ids)
    z = w2s.classifier_logits(lm, weak, data.half_b.tokens, data.half_b.mask, ids)
    assert soft.shape == (5, 2)
    np.testing.assert_allclose(soft, jax.nn.softmax(z, -1), rtol=1e-5, atol=1e-6)


def test_binary_views():
    scr = make_task("screening")
    ex = scr.example("train", 0)
    text, label = w2s.BINARY_VIEWS.get("screening")(scr, ex)
    assert text.startswith("CV: ") and label == int(ex.answer == "SELECTED")
    top = make_task("topics")
    labels = [w2s.BINARY_VIEWS.get("topics")(top, e)[1] for e in top.examples("train", 0, 40)]
    assert labels == [int(e.meta[0] >= 3) for e in top.examples("train", 0, 40)]


def test_errors_are_one_line():
    with pytest.raises(ValueError, match="0 / 1"):
        w2s.one_hot_targets([0, 2])
    with pytest.raises(ValueError, match="LAYERSxWIDTH"):
        w2s.parse_size("2-64", 16)
    with pytest.raises(ValueError, match="warmup"):
        w2s.TrainConfig(steps=5, warmup=5)
    with pytest.raises(LookupError, match="w2s loss"):
        w2s.make_train(CFG, LM, "hinge", (0, 1))
