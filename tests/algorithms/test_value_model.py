"""The ReST-RL value model (`models.value.ValueLM`) and its trainer (`algorithms.value`).

One tiny ValueLM (1 layer, d_model 32) over the byte tokenizer, states left-padded to 48 tokens,
batches of 8: one compiled update and one compiled forward serve every test (a second forward
at width 24 checks that the pad amount does not change a value).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_suite.algorithms.value import ValueConfig, ValueTrainer, value_mse_loss
from jaxrl_suite.core.parallel import make_mesh
from jaxrl_suite.envs.text.tokenizer import load_tokenizer
from jaxrl_suite.models import CausalLM, LMConfig, ValueLM
from jaxrl_suite.models.value import init_from_policy

STATE_LEN = 48
BATCH = 8
# 8 good and 8 bad partial programs; the word that decides the target is on the last line.
GOOD = [f"# task {i}\ndef f(x):\n    y = x * {i}\n    return good\n" for i in range(8)]
BAD = [f"# task {i}\ndef f(x):\n    y = x * {i}\n    return bad\n" for i in range(8)]


@pytest.fixture(scope="module")
def setup():
    tok = load_tokenizer()
    config = LMConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=1, n_heads=2,
                      n_kv_heads=2, d_ff=64)
    model = ValueLM(config)
    params = model.init(jax.random.PRNGKey(0), np.zeros((1, STATE_LEN), np.int32),
                        np.ones((1, STATE_LEN), bool))
    trainer = ValueTrainer(model, tok, ValueConfig(lr=3e-3, steps=80, batch_size=BATCH),
                           mesh=make_mesh(1), state_len=STATE_LEN)
    return trainer, params


@pytest.fixture(scope="module")
def fitted(setup):
    """The toy set fitted for 80 steps: (initial values, final values, history, state)."""
    trainer, params = setup
    states, targets = GOOD + BAD, np.array([0.9] * 8 + [0.1] * 8, np.float32)
    before = trainer.predict(params, states)
    state = trainer.init_state(params, jax.random.PRNGKey(1))
    state, history = trainer.fit(state, states, targets, seed=0)
    return before, trainer.predict(state.params, states), history, state


def test_values_have_shape_b_and_lie_in_0_1(setup):
    trainer, params = setup
    values = trainer.predict(params, GOOD[:3])
    assert values.shape == (3,) and values.dtype == np.float32
    assert np.all((values > 0) & (values < 1))
    np.testing.assert_array_equal(trainer.value_fn(params)(GOOD[:3]), values)


def test_padding_does_not_change_a_value(setup):
    # The same state at two pad amounts (widths 48 and 24), and with garbage ids under the mask:
    # the key mask hides the pads, and positions count the real tokens only.
    trainer, params = setup
    state = "def f(x):\n    return x\n"
    tokens, mask = trainer.encode([state] * BATCH)
    assert mask[0].sum() == len(state) < STATE_LEN - 8
    garbage = np.random.default_rng(0).integers(3, 259, tokens.shape, dtype=np.int32)
    tokens[1:] = np.where(mask[1:], tokens[1:], garbage[1:])
    apply = jax.jit(trainer.model.apply)
    wide = np.asarray(apply(params, tokens, mask))
    narrow = np.asarray(apply(params, *trainer.tokenizer.encode_batch([state], 24, side="left")))
    np.testing.assert_allclose(wide, wide[0], rtol=0, atol=1e-6)
    np.testing.assert_allclose(narrow, wide[:1], rtol=0, atol=1e-6)


def test_encode_left_pads_and_keeps_the_last_tokens_of_a_long_state(setup):
    trainer, _ = setup
    long = "x = 1\n" * 20  # 120 bytes > 48
    tokens, mask = trainer.encode(["ab", long])
    ids = trainer.tokenizer.encode(long)
    np.testing.assert_array_equal(tokens[1], ids[-STATE_LEN:])
    assert mask[1].all() and mask[0].sum() == 2 and mask[0, -2:].all()
    assert (tokens[0, :-2] == trainer.tokenizer.pad_id).all()
    with pytest.raises(ValueError, match="state 1 has no tokens"):
        trainer.encode(["a", ""])


def test_fit_separates_good_from_bad_states(fitted):
    before, after, history, state = fitted
    targets = np.array([0.9] * 8 + [0.1] * 8)
    mse_before, mse_after = np.mean((before - targets) ** 2), np.mean((after - targets) ** 2)
    assert mse_after < 0.1 * mse_before, (mse_before, mse_after)
    assert after[:8].min() > after[8:].max()  # every good state above every bad one
    assert history["loss"].shape == (80,) and history["finite"].all()
    assert history["loss"][-10:].mean() < 0.2 * history["loss"][:10].mean()
    assert int(state.step) == 80


def test_step_predict_and_value_fn_compile_once(setup, fitted):
    trainer, _ = setup
    _, after, _, state = fitted
    state, metrics = trainer.step(state, GOOD[:4] + BAD[:4], np.full(8, 0.5, np.float32))
    assert set(metrics) >= {"loss", "mse", "value_mean", "grad_norm", "param_norm"}
    states = GOOD + BAD + GOOD[:3]  # 19 rows: two full batches of 8 and one padded
    many = trainer.predict(state.params, states)
    one = trainer.value_fn(state.params)([BAD[5]])
    assert many.shape == (19,) and one.shape == (1,)
    np.testing.assert_allclose(many[16:], many[:3], rtol=0, atol=1e-6)
    np.testing.assert_allclose(one, many[13:14], rtol=0, atol=1e-6)
    assert trainer._update._cache_size() == 1
    assert trainer._values._cache_size() == 1


def test_init_from_policy_copies_the_backbone(setup):
    trainer, params = setup
    policy = CausalLM(trainer.model.config)
    policy_params = policy.init(jax.random.PRNGKey(7), np.zeros((1, 4), np.int32))
    warm = init_from_policy(params, policy_params)
    jax.tree.map(np.testing.assert_array_equal, warm["params"]["backbone"],
                 policy_params["params"])
    jax.tree.map(np.testing.assert_array_equal, warm["params"]["head"], params["params"]["head"])
    other = CausalLM(LMConfig(vocab_size=trainer.model.config.vocab_size, d_model=64,
                              n_layers=1, n_heads=2, n_kv_heads=2, d_ff=64))
    shapes = jax.eval_shape(other.init, jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))
    with pytest.raises(ValueError, match=r"^init_from_policy: backbone leaf \S+ is [^\n]*$"):
        init_from_policy(params, shapes)


def test_fit_from_policy_is_init_from_policy_then_fit(setup):
    """The one warm-start helper equals its steps written out (bit for bit)."""
    trainer, _ = setup
    policy_params = CausalLM(trainer.model.config).init(jax.random.PRNGKey(7),
                                                        np.zeros((1, 4), np.int32))
    states, targets = GOOD[:3] + BAD[:3], [0.9] * 3 + [0.1] * 3
    state, history = trainer.fit_from_policy(policy_params, states, targets,
                                             init_key=jax.random.PRNGKey(3),
                                             state_key=jax.random.PRNGKey(4), seed=5, steps=3)
    init = init_from_policy(trainer.model.init(jax.random.PRNGKey(3), *trainer.encode(["x"])),
                            policy_params)
    want, want_history = trainer.fit(trainer.init_state(init, jax.random.PRNGKey(4)), states,
                                     np.array(targets), steps=3, seed=5)
    jax.tree.map(np.testing.assert_array_equal, state.params, want.params)
    np.testing.assert_array_equal(history["mse"], want_history["mse"])
    assert history["mse"].shape == (3,)


@pytest.mark.parametrize("changes, field", [
    (dict(lr=0.0), "value.lr"),
    (dict(steps=0), "value.steps"),
    (dict(batch_size=-1), "value.batch_size"),
    (dict(max_grad_norm=0.0), "value.max_grad_norm"),
    (dict(warmup_steps=-1), "value.warmup_steps"),
    (dict(weight_decay=-0.1), "value.weight_decay"),
])
def test_bad_config_raises_one_line(changes, field):
    with pytest.raises(ValueError, match=rf"^config field '{field}' must be [^\n]*$"):
        ValueConfig(**changes)


def test_bad_trainer_arguments_raise(setup):
    trainer, params = setup
    with pytest.raises(ValueError, match="state_len must be in 1..512"):
        ValueTrainer(trainer.model, trainer.tokenizer, ValueConfig(), mesh=make_mesh(1),
                     state_len=513)
    state = trainer.init_state(params, jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match=r"targets must have shape \(2,\)"):
        trainer.step(state, GOOD[:2], np.zeros(3))
    with pytest.raises(ValueError, match=r"targets must lie in \[0, 1\]"):
        trainer.fit(state, GOOD[:2], np.array([0.5, 1.5]), steps=1)
    with pytest.raises(ValueError, match="must be equal"):
        value_mse_loss(jnp.zeros(3), jnp.zeros((3, 1)))
