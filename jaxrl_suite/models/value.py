"""A value model over text states: a small causal LM with a scalar head on its last position.

ReST-RL (Zhoubian et al. 2025, arXiv 2508.19576) scores partial programs, a prompt plus the first
lines of a solution, with a value model (VM) trained by MSE on Monte-Carlo value targets in [0, 1]
from a tree search (`sampling/mcts.py`, `algorithms/value.py`); trained on finished programs and
their final rewards only, the same model is an outcome reward model (ORM).

    h = final_norm(CausalLM(tokens))[:, T-1]       [B, D]  (left-padded: the state's last token)
    V(s) = sigmoid(w . h + b)                      [B]     in (0, 1)

The backbone is a separate `CausalLM`, not a head on the policy, so the policy's RL updates never
move the value model (and the VM's regression never moves the policy). Its params sit under
"backbone" with the layout of a `CausalLM` of the same `LMConfig`, so `init_from_policy` can
warm-start it from a policy's params.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_suite.models.lm import CausalLM, LMConfig
from jaxrl_suite.models.sharding import path_str


class ValueLM(nn.Module):
    """V(s) in (0, 1) of left-padded text states: params {"params": {"backbone", "head"}}."""

    config: LMConfig

    @nn.compact
    def __call__(self, tokens: jax.Array, key_mask: jax.Array) -> jax.Array:
        """Values of tokens [B, T] int32 with key_mask [B, T] bool (False = left padding).

        Positions count the real tokens (0 at a row's first one), as the policy sees a
        left-padded prompt, so the pad amount does not change a state's value. Returns [B] float32.
        """
        key_mask = key_mask.astype(bool)
        positions = jnp.maximum(jnp.cumsum(key_mask, axis=1) - 1, 0)  # [B, T]
        _, _, h = CausalLM(self.config, name="backbone")(
            tokens, positions=positions, key_mask=key_mask, return_hidden=True,
            return_logits=False)  # h: [B, T, D]
        last = h[:, -1].astype(jnp.float32)  # [B, D]
        logit = nn.Dense(1, dtype=jnp.float32, param_dtype=self.config.param_jnp_dtype,
                         name="head")(last)[:, 0]  # [B]
        return jax.nn.sigmoid(logit)


def init_from_policy(value_params, policy_params):
    """`value_params` with its backbone replaced by the policy's params (same `LMConfig`).

    Every backbone leaf is taken from `policy_params["params"]` at the same path; policy leaves
    the value model does not use (an untied `lm_head`) are left out. The head is kept.

    Raises:
      ValueError: (one line) if a backbone leaf is missing from the policy or has another shape.
    """
    backbone = value_params["params"]["backbone"]
    policy = policy_params["params"]
    missing = [k for k in backbone if k not in policy]
    if missing:
        raise ValueError(f"init_from_policy: the policy params have no {', '.join(missing)} "
                         "(is it a CausalLM of the value model's LMConfig?)")
    copied = {k: policy[k] for k in backbone}
    want = jax.tree_util.tree_flatten_with_path(backbone)[0]
    got = jax.tree_util.tree_flatten_with_path(copied)[0]
    want_shapes = {path_str(p): np.shape(x) for p, x in want}
    got_shapes = {path_str(p): np.shape(x) for p, x in got}
    if want_shapes != got_shapes:
        bad = sorted(set(want_shapes.items()) ^ set(got_shapes.items()))[0][0]
        raise ValueError(f"init_from_policy: backbone leaf {bad} is "
                         f"{want_shapes.get(bad, 'absent')} in the value model but "
                         f"{got_shapes.get(bad, 'absent')} in the policy (another LMConfig?)")
    return {**value_params, "params": {**value_params["params"], "backbone": copied}}


__all__ = ["ValueLM", "init_from_policy"]
