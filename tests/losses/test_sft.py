"""losses/sft.py against a numpy cross-entropy with the answer mask."""

import jax
import numpy as np
import pytest

from jaxrl_suite.losses import token_logprobs
from jaxrl_suite.losses.sft import sft_loss


def numpy_nll(logits, targets, mask):
    """-sum(mask * log softmax(logits)[target]) / sum(mask), in float64."""
    z = logits.astype(np.float64)
    logz = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1)
    picked = np.take_along_axis(z, targets[..., None], -1)[..., 0]
    return -((picked - logz) * mask).sum() / mask.sum()


@pytest.mark.parametrize("jit", [False, True])
def test_sft_loss_is_the_masked_token_mean_cross_entropy(jit):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 5, 7)).astype(np.float32) * 3
    targets = rng.integers(0, 7, size=(3, 5))
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 1, 1, 0]], np.float32)  # answers

    def loss(lg, t, m):
        return sft_loss(token_logprobs(lg, t), m)

    value, metrics = (jax.jit(loss) if jit else loss)(logits, targets, mask)
    assert float(value) == pytest.approx(numpy_nll(logits, targets, mask), rel=1e-5)
    assert float(metrics["tokens"]) == 10.0 and float(metrics["nll"]) == float(value)
    # the masked-out tokens do not count, whatever their logits
    logits2 = logits.copy()
    logits2[mask == 0] = rng.normal(size=(int((mask == 0).sum()), 7)) * 50
    assert float(loss(logits2, targets, mask)[0]) == pytest.approx(float(value), rel=1e-5)


def test_sft_loss_hand_worked_case():
    # two tokens counted: log-probs log(1/2) and log(1/4) -> loss (ln 2 + ln 4) / 2
    logp = np.log(np.array([[0.5, 0.25, 0.9]], np.float32))
    value, _ = sft_loss(logp, np.array([[1.0, 1.0, 0.0]], np.float32))
    assert float(value) == pytest.approx((np.log(2) + np.log(4)) / 2, rel=1e-6)


def test_sft_loss_rejects_a_bad_shape():
    with pytest.raises(AssertionError):
        sft_loss(np.zeros((2, 3), np.float32), np.zeros((2, 4), np.float32))
