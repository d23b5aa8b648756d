"""OPPO: offline preference-guided policy optimisation (Kang et al., ICML 2023, arXiv 2305.16217).

From an offline dataset and preferences between pairs of its segments, OPPO learns in one step,
without a reward model, a hindsight encoder phi, a contextual policy pi(a | s, z) and the optimal
context z* (losses in `losses/oppo.py`). Each training step:

  1. draws `batch_pairs` labelled pairs of K-step segments;
  2. updates encoder and policy on  recon + lambda_pref * triplet(z*, phi+, phi-) + lambda_norm *
     (||phi|| - 1)^2  with z* fixed;
  3. updates z* alone on the triplet loss, with phi recomputed by the updated encoder.

At test time the policy acts with z*. `make_train(config, env) -> (train, oppo)`, and
`train(rng, data)` is one jitted program (a `lax.scan` over steps) on `data =
oppo.prepare(dataset, prefs)` (`PreferenceData`), an argument, so `jax.vmap(train, in_axes=(0,
None))(keys, data)` trains several seeds at once and one compilation serves every dataset of the
same shape. Both updates go through `core.train.apply_gradients`, which refuses a non-finite
one (those parameters stay as they were; the optimizer state is not rolled back, so after a
non-finite gradient the run halts at its last finite parameters); the per-step metric
"nonfinite" counts the refused updates (up to 2 per step).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxrl_suite.algorithms.offline_data import PreferenceData, preference_data
from jaxrl_suite.core.config import Count, NonNegative, Positive, check_fields
from jaxrl_suite.core.train import ParamState, TrainAndAgent, apply_gradients
from jaxrl_suite.envs.contextual import ContextualEnv
from jaxrl_suite.envs.offline import action_scale_shift, evaluate_policy, gather_segments
from jaxrl_suite.losses.common import masked_mean
from jaxrl_suite.losses.oppo import action_mse, oppo_loss, oppo_preference_loss, phi_norm_loss
from jaxrl_suite.models.oppo import ContextPolicy, SegmentEncoder


@dataclasses.dataclass(frozen=True)
class OPPOConfig:
    segment_length: Count = 20  # K: steps per segment (must match the preferences' segments)
    z_dim: Count = 8  # size of the hindsight context z
    hidden: tuple[Count, ...] = (64, 64)  # encoder and policy MLP widths
    batch_pairs: Count = 64  # labelled pairs per step
    steps: Count = 2000  # training steps
    lr: NonNegative = 1e-3  # Adam, encoder and policy
    z_lr: NonNegative = 1e-3  # Adam, z*
    lambda_pref: NonNegative = 0.1  # weight of the triplet loss in the encoder/policy objective
    lambda_norm: NonNegative = 0.1  # weight of the (||phi|| - 1)^2 regulariser
    margin: NonNegative = 1.0  # triplet margin
    max_grad_norm: Positive = 0.25  # global-norm clipping of the encoder/policy update
    eval_episodes: Count = 10  # episodes of the z*-conditioned policy per evaluation

    def __post_init__(self):
        check_fields(self, "oppo.")  # the Ranges declared above


class OPPOState(flax.struct.PyTreeNode):
    params: Any  # {"encoder": ..., "policy": ...}
    z_star: jax.Array  # [z_dim]
    opt_state: Any
    z_opt_state: Any
    rng: jax.Array
    step: jax.Array


class OPPO:
    """The pieces of one OPPO run; the data (`prepare`) are an argument of `init` and `update`."""

    def __init__(self, config: OPPOConfig, env: ContextualEnv):
        self.config, self.env = config, env
        self.encoder = SegmentEncoder(z_dim=config.z_dim, hidden=config.hidden)
        scale, shift = action_scale_shift(env)
        self.policy = ContextPolicy(action_dim=env.num_actions, discrete=env.discrete,
                                    action_scale=scale, action_shift=shift,
                                    hidden=config.hidden)
        self.optimizer = optax.chain(optax.clip_by_global_norm(config.max_grad_norm),
                                     optax.adam(config.lr))
        self.z_optimizer = optax.adam(config.z_lr)

    def prepare(self, data, prefs) -> PreferenceData:
        """A D4RL-layout dataset and its `make_preferences` pairs as the `PreferenceData` that
        `train(rng, data)` takes (checked against `config.segment_length`)."""
        return preference_data(self.env, data, prefs, self.config.segment_length)

    # -- networks -------------------------------------------------------------------------------
    def embed(self, params, obs, action_features):
        mask = jnp.ones(obs.shape[:-1], jnp.float32)
        return self.encoder.apply(params["encoder"], obs, action_features, mask)

    def act(self, params, obs, z):
        """The policy's action for obs [B, obs_dim] under context z [z_dim] (greedy)."""
        out = self.policy.apply(params["policy"], obs, jnp.broadcast_to(z, (*obs.shape[:-1],
                                                                            z.shape[-1])))
        return jnp.argmax(out, axis=-1) if self.env.discrete else out

    def recon_loss(self, params, obs, actions, z):
        """Hindsight information matching: actions of a segment given its own z. [B, K, ...]"""
        zk = jnp.broadcast_to(z[..., None, :], (*obs.shape[:-1], z.shape[-1]))
        out = self.policy.apply(params["policy"], obs, zk)
        mask = jnp.ones(obs.shape[:-1], jnp.float32)
        if self.env.discrete:
            nll = -jnp.take_along_axis(jax.nn.log_softmax(out), actions[..., None], -1)[..., 0]
            return masked_mean(nll, mask)
        return action_mse(out, actions, mask)

    # -- training -------------------------------------------------------------------------------
    def init(self, rng: jax.Array, data: PreferenceData) -> OPPOState:
        c = self.config
        k_enc, k_pol, k_z, rng = jax.random.split(rng, 4)
        obs = data.obs[: c.segment_length]
        feats = data.action_features[: c.segment_length]
        params = {
            "encoder": self.encoder.init(k_enc, obs, feats, jnp.ones(c.segment_length)),
            "policy": self.policy.init(k_pol, obs[:1], jnp.zeros((1, c.z_dim))),
        }
        z_star = jax.random.normal(k_z, (c.z_dim,)) / jnp.sqrt(c.z_dim)
        return OPPOState(params, z_star, self.optimizer.init(params),
                         self.z_optimizer.init(z_star), rng, jnp.zeros((), jnp.int32))

    def _batch(self, key, data: PreferenceData):
        c = self.config
        idx = jax.random.randint(key, (c.batch_pairs,), 0, data.starts.shape[0])
        starts = data.starts[idx]  # [B, 2]
        return (gather_segments(data.obs, starts, c.segment_length),  # [B, 2, K, obs]
                gather_segments(data.action_features, starts, c.segment_length),
                gather_segments(data.actions, starts, c.segment_length),
                data.label[idx])

    def update(self, state: OPPOState,
               data: PreferenceData) -> tuple[OPPOState, dict[str, jax.Array]]:
        c = self.config
        rng, k_batch = jax.random.split(state.rng)
        obs, feats, actions, label = self._batch(k_batch, data)
        z_star = jax.lax.stop_gradient(state.z_star)

        def loss_fn(params):
            phi = self.embed(params, obs, feats)  # [B, 2, Z]
            recon = self.recon_loss(params, obs, actions, phi)
            pref, pm = oppo_preference_loss(z_star, phi[:, 0], phi[:, 1], label, margin=c.margin)
            norm = phi_norm_loss(phi.reshape(-1, c.z_dim))
            total = oppo_loss(recon, pref, norm, lambda_pref=c.lambda_pref,
                              lambda_norm=c.lambda_norm)
            return total, {"loss": total, "recon": recon, "pref": pref, "phi_norm": norm, **pm}

        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        nets, norms = apply_gradients(ParamState(state.step, state.params, state.opt_state),
                                      grads, self.optimizer, loss=loss, keep="params")

        phi = jax.lax.stop_gradient(self.embed(nets.params, obs, feats))
        z_loss = lambda z: oppo_preference_loss(z, phi[:, 0], phi[:, 1], label,
                                                margin=c.margin)[0]
        z_value, z_grad = jax.value_and_grad(z_loss)(state.z_star)
        z, z_norms = apply_gradients(ParamState(state.step, state.z_star, state.z_opt_state),
                                     z_grad, self.z_optimizer, loss=z_value, keep="params")
        refused = (~norms.pop("finite")).astype(jnp.int32) + (~z_norms["finite"]).astype(jnp.int32)
        metrics = dict(metrics, **norms, z_loss=z_value, z_norm=jnp.linalg.norm(z.params),
                       z_grad_norm=z_norms["grad_norm"], nonfinite=refused)
        return (OPPOState(nets.params, z.params, nets.opt_state, z.opt_state, rng, state.step + 1),
                metrics)

    def evaluate(self, params, z, key: jax.Array) -> jax.Array:
        """Mean return of `eval_episodes` episodes of the policy conditioned on z."""
        returns = evaluate_policy(self.env, lambda obs, k: self.act(params, obs, z), key,
                                  num_episodes=self.config.eval_episodes)
        return returns.mean()


def make_train(config: OPPOConfig, env: ContextualEnv) -> TrainAndAgent:
    """`(train, oppo)`: `train(rng, data) -> (OPPOState, metrics)` runs `config.steps` updates
    on `data = oppo.prepare(dataset, prefs)` in one `lax.scan` (metrics stacked over steps) and
    a final evaluation ("eval_return", the mean return under z*)."""
    oppo = OPPO(config, env)

    def train(rng: jax.Array, data: PreferenceData):
        k_init, k_eval = jax.random.split(rng)
        state = oppo.init(k_init, data)
        state, metrics = jax.lax.scan(lambda s, _: oppo.update(s, data), state, None,
                                      config.steps)
        metrics["eval_return"] = oppo.evaluate(state.params, state.z_star, k_eval)
        return state, metrics

    return TrainAndAgent(train, oppo)


# -- analysis of a trained OPPO agent (per-seed states stacked on axis 0) ---------------------
def segment_embeddings(agent, batch, params) -> jax.Array:
    """phi of every labelled segment (both of each pair) under one seed's params: [2P, Z]."""
    starts = batch.starts.reshape(-1)  # [2P]
    k = agent.config.segment_length
    return agent.embed(params, gather_segments(batch.obs, starts, k),
                       gather_segments(batch.action_features, starts, k))


def context_diagnostics(agent, batch, state, prefs: dict, key: jax.Array) -> dict:
    """Where z* lies and what other contexts give, per seed (diagnostics, not methods):

    near_phi   the policy conditioned on the labelled segment's phi nearest to z* (z* projected
               onto the data; uses no true reward)
    best_phi   conditioned on phi of the labelled segment with the highest true return (an
               oracle choice of context: it reads the true returns)
    gap        ||z* - nearest phi|| against the median nearest-neighbour distance among the phis
    """
    seg_returns = jnp.asarray(prefs["returns"]).reshape(-1)  # [2P]

    def per_seed(params, z_star, k, batch):
        phi = segment_embeddings(agent, batch, params)
        d_star = jnp.linalg.norm(phi - z_star, axis=-1)
        pair = jnp.linalg.norm(phi[:, None] - phi[None], axis=-1)
        nn = jnp.min(jnp.where(jnp.eye(phi.shape[0], dtype=bool), jnp.inf, pair), axis=1)
        k_near, k_best = jax.random.split(k)
        return {"near_phi_return": agent.evaluate(params, phi[jnp.argmin(d_star)], k_near),
                "best_phi_return": agent.evaluate(params, phi[jnp.argmax(seg_returns)], k_best),
                "z_star_to_nearest_phi": jnp.min(d_star), "phi_nn_median": jnp.median(nn),
                "z_star_norm": jnp.linalg.norm(z_star)}

    keys = jax.random.split(key, state.z_star.shape[0])
    out = jax.jit(jax.vmap(per_seed, in_axes=(0, 0, 0, None)))(state.params, state.z_star, keys,
                                                                batch)
    return {k: np.asarray(v, np.float64).tolist() for k, v in out.items()}


def zspace_pca(agent, batch, state, prefs: dict) -> dict:
    """PCA (2-D) of seed 0's phi over every labelled segment, with z* projected the same way."""
    params = jax.tree.map(lambda x: x[0], state.params)
    phi = np.asarray(segment_embeddings(agent, batch, params))  # [2P, Z]
    z_star = np.asarray(state.z_star[0])
    mean = phi.mean(axis=0)
    _, s, vt = np.linalg.svd(phi - mean, full_matrices=False)
    comps = vt[:2]
    explained = (s[:2] ** 2 / max(float((s**2).sum()), 1e-12)).tolist()
    returns = np.asarray(prefs["returns"]).reshape(-1)
    dist = np.linalg.norm(phi - z_star, axis=1)
    corr = float(np.corrcoef(dist, returns)[0, 1]) if returns.std() > 0 else float("nan")
    return {"pc": ((phi - mean) @ comps.T).tolist(), "returns": returns.tolist(),
            "z_star": ((z_star - mean) @ comps.T).tolist(), "explained": explained,
            "corr_dist_return": corr}


# -- the experiment --------------------------------------------------------------------------------


__all__ = ["OPPO", "OPPOConfig", "OPPOState", "context_diagnostics", "make_train",
           "segment_embeddings", "zspace_pca"]
