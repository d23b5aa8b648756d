"""Generalized advantage estimation and the PPO clipped surrogate loss (pure array functions).

References: Schulman, Moritz, Levine, Jordan, Abbeel, "High-Dimensional Continuous Control Using
Generalized Advantage Estimation", ICLR 2016 (arXiv 1506.02438); Schulman, Wolski, Dhariwal,
Radford, Klimov, "Proximal Policy Optimization Algorithms", arXiv 1707.06347.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def gae(
    rewards: jax.Array,
    values: jax.Array,
    next_values: jax.Array,
    terminated: jax.Array,
    dones: jax.Array,
    gamma: float | jax.Array,
    gae_lambda: float | jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """GAE(gamma, lambda) over a time-major rollout (leading axis T, any batch axes after it).

        delta_t = r_t + gamma * (1 - term_t) * V(s'_t) - V(s_t)
        A_t     = delta_t + gamma * lambda * (1 - done_t) * A_{t+1},      A_T = 0
        R_t     = A_t + V(s_t)                       (the value target)

    `next_values[t]` is V(s'_t) of the true next state of step t: on a step that ends by
    truncation (time limit) that is the final observation, not the auto-reset one, so the return
    bootstraps through truncation; `terminated` zeroes the bootstrap only on true terminal states.
    `dones = terminated | truncated` cuts the advantage recursion at every episode boundary.
    Returns (advantages, returns), both shaped like `rewards`.
    """
    if not rewards.shape == values.shape == next_values.shape == terminated.shape == dones.shape:
        raise ValueError(
            "gae: rewards, values, next_values, terminated and dones must share one shape, got "
            f"{[x.shape for x in (rewards, values, next_values, terminated, dones)]}"
        )
    not_term = 1.0 - terminated.astype(rewards.dtype)
    not_done = 1.0 - dones.astype(rewards.dtype)
    deltas = rewards + gamma * not_term * next_values - values

    def back(carry, xs):
        delta, nd = xs
        adv = delta + gamma * gae_lambda * nd * carry
        return adv, adv

    _, adv = jax.lax.scan(back, jnp.zeros_like(deltas[0]), (deltas, not_done), reverse=True)
    return adv, adv + values


def ppo_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    values: jax.Array,
    old_values: jax.Array,
    returns: jax.Array,
    entropy: jax.Array,
    *,
    clip_eps: float | jax.Array = 0.2,
    vf_coef: float | jax.Array = 0.5,
    ent_coef: float | jax.Array = 0.01,
    clip_value: bool = True,
    normalize_advantages: bool = True,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """PPO-clip loss over a minibatch of samples (all inputs share one shape).

        r        = exp(logp - old_logp)
        A        = (A - mean A) / (std A + 1e-8)                          if normalize_advantages
        L_pi     = -mean( min(r A, clip(r, 1 - eps, 1 + eps) A) )
        V_clip   = V_old + clip(V - V_old, -eps, eps)
        L_V      = 0.5 * mean( max((V - R)^2, (V_clip - R)^2) )            (0.5 mean (V - R)^2
                                                                             without clip_value)
        L        = L_pi + vf_coef * L_V - ent_coef * mean(H)

    Returns (L, metrics) with metrics policy_loss, value_loss, entropy, approx_kl (the
    (r - 1) - log r estimator) and clip_frac (fraction of samples with |r - 1| > eps).
    """
    shapes = [x.shape for x in (logp, old_logp, advantages, values, old_values, returns, entropy)]
    if len(set(shapes)) != 1:
        raise ValueError(f"ppo_loss: all inputs must share one shape, got {shapes}")
    if normalize_advantages:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    log_ratio = logp - old_logp
    ratio = jnp.exp(log_ratio)
    surrogate = jnp.minimum(
        ratio * advantages, jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    )
    policy_loss = -surrogate.mean()
    v_err = jnp.square(values - returns)
    if clip_value:
        v_clipped = old_values + jnp.clip(values - old_values, -clip_eps, clip_eps)
        v_err = jnp.maximum(v_err, jnp.square(v_clipped - returns))
    value_loss = 0.5 * v_err.mean()
    ent = entropy.mean()
    loss = policy_loss + vf_coef * value_loss - ent_coef * ent
    metrics = {
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy": ent,
        "approx_kl": jnp.mean((ratio - 1.0) - log_ratio),
        "clip_frac": jnp.mean((jnp.abs(ratio - 1.0) > clip_eps).astype(jnp.float32)),
    }
    return loss, metrics
