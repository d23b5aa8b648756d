"""The KeyFrame-aware GRPO reward (ChronoForge-RL, KF-GRPO) and Video-R1's temporal contrast
(T-GRPO) as its special case.

ChronoForge-RL's abstract names KF-GRPO "a contrastive learning paradigm with a saliency-enhanced
reward mechanism that explicitly incentivizes models to leverage both frame content and temporal
relationships"; no code is public. This reconstruction follows the nearest public mechanics,
Video-R1's T-GRPO (arXiv 2503.21776; its trainer: G rollouts on the ordered frames and G / 2 on
shuffled frames, and +0.3 on every correct ordered rollout when the ordered accuracy is at least
0.8 times the shuffled one), and adds what the abstract names: a content contrast (rollouts on k
uniform frames) and the saliency of the chosen frames. Per prompt b with G ordered rollouts
(base reward r_bi, correctness c_bi in {0, 1}) and contrast rollouts of C views (correctness
c^v_bj, scored, never trained on):

    p_b = mean_i c_bi,   q_b = max_v mean_j c^v_bj      (the best contrast view)
    gate_b = 1[p_b >= ratio * q_b + margin]
    r'_bi = r_bi + bonus * m_b * c_bi * gate_b

m_b in [0, 1] is the saliency mass of the prompt's chosen frames (`sampling.keyframes.
saliency_mass`: their TAD scores over the k largest). T-GRPO is C = 1 (shuffled), m = 1,
ratio = 0.8, margin = 0, bonus = 0.3; KF-GRPO's defaults here are both views, ratio = 1 and
margin = 1/8 (one more correct rollout of 8 than the best contrast). The group-normalised
advantages are then computed from r' as usual (the trainer's custom-advantage path).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp

T_GRPO = {"bonus": 0.3, "ratio": 0.8, "margin": 0.0}  # Video-R1's constants


def contrast_gate(correct, contrasts: Sequence, *, ratio: float = 1.0, margin: float = 0.125):
    """gate [B]: 1.0 where the ordered accuracy p_b = mean_i correct[b, i] is at least
    ratio * q_b + margin, q_b = max over the views of mean_j view[b, j] (module docstring).
    correct [B, G]; contrasts: one [B, G_v] array of correctness per contrast view (at least
    one)."""
    if not len(contrasts):
        raise ValueError("contrast_gate: at least one contrast view")
    p = jnp.mean(jnp.asarray(correct, jnp.float32), axis=-1)
    q = jnp.max(jnp.stack([jnp.mean(jnp.asarray(v, jnp.float32), axis=-1) for v in contrasts]),
                axis=0)
    return (p >= ratio * q + margin).astype(jnp.float32)


def kf_grpo_rewards(rewards, correct, contrasts: Sequence, saliency=1.0, *, bonus: float = 0.3,
                    ratio: float = 1.0, margin: float = 0.125):
    """r' [B, G] = rewards + bonus * saliency_b * correct * gate_b (module docstring).

    rewards, correct [B, G] (correct in {0, 1}); contrasts: [B, G_v] correctness per contrast
    view; saliency: [B] or a scalar in [0, 1]. Pure and jit-compatible."""
    gate = contrast_gate(correct, contrasts, ratio=ratio, margin=margin)
    m = jnp.broadcast_to(jnp.asarray(saliency, jnp.float32), gate.shape)
    return (jnp.asarray(rewards, jnp.float32)
            + bonus * (m * gate)[:, None] * jnp.asarray(correct, jnp.float32))


__all__ = ["T_GRPO", "contrast_gate", "kf_grpo_rewards"]
