"""Parity of `models/hf.py` with transformers' own PyTorch Llama / Qwen2 / Qwen3.

    python benchmarks/hf_parity.py                 # prints the table, writes results/hf_parity.json

For each family a tiny random model (2 layers, hidden 64, 4 query / 2 kv heads, vocab 320) is built
from its config with transformers (no download), saved with `save_pretrained` next to a byte-level
BPE tokenizer trained here on two sentences, loaded back with `load_hf_checkpoint`, and compared on
a fixed left-padded batch [3, 12]: the max |logit difference| over real positions (float32), and
whether 16 greedy tokens equal `model.generate(do_sample=False)`. Biases (Qwen2), q/k norm scales
(Qwen3) and the layer norms are randomised, since the init leaves them at 0 / 1. Llama is saved in
5 shards (through the index file). tests/models/test_hf.py uses the same builders.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

PAD, EOS = 0, 1
SIZES = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)


def tiny_tokenizer():
    """A byte-level BPE tokenizer (vocab 300, <pad>=0, </s>=1) as a transformers tokenizer."""
    from jaxrl_suite.envs.text.tokenizer import train_bpe

    corpus = ["12+34=<answer>46</answer>", "the quick brown fox jumps over the lazy dog"] * 20
    return train_bpe(corpus, 300).hf


def tiny_torch_model(family: str):
    """A seeded random transformers `{Llama,Qwen2,Qwen3}ForCausalLM` (eval mode, EOS off)."""
    import torch
    import transformers

    config_cls, model_cls, extra = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {}),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, {}),
        # head_dim != hidden / heads, as in the real Qwen3 models
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, {"head_dim": 32}),
    }[family]
    cfg = config_cls(**SIZES, rope_theta=5e5 if family == "llama" else 1e6,
                     tie_word_embeddings=family != "llama", initializer_range=0.2,
                     eos_token_id=EOS, pad_token_id=PAD, **extra)
    torch.manual_seed(0)
    model = model_cls(cfg).eval()
    with torch.no_grad():  # the init leaves biases at 0 and norm scales at 1: make them count
        for layer in model.model.layers:
            attn = layer.self_attn
            if family == "qwen2":
                for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
                    proj.bias.normal_(0.0, 0.2)
            if family == "qwen3":
                attn.q_norm.weight.normal_(1.0, 0.3)
                attn.k_norm.weight.normal_(1.0, 0.3)
            layer.input_layernorm.weight.normal_(1.0, 0.3)
    model.generation_config.eos_token_id = None  # generate every one of the new tokens
    return model


def save_tiny_checkpoint(family: str, path: Path):
    """Build `tiny_torch_model(family)`, save it (Llama in 5 shards) and the tokenizer to `path`."""
    model = tiny_torch_model(family)
    model.save_pretrained(path, max_shard_size="100KB" if family == "llama" else "5GB")
    tiny_tokenizer().save_pretrained(path)
    return model


def fixed_batch():
    """A fixed left-padded batch [3, 12]: row 0 full, rows 1 and 2 with 4 and 7 pad slots."""
    ids = np.random.default_rng(0).integers(2, 299, (3, 12))
    mask = np.ones_like(ids)
    mask[1, :4] = mask[2, :7] = 0
    return ids, mask


def torch_logits(model, ids, mask):
    import torch

    with torch.no_grad():
        return model(torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()


def torch_greedy(model, ids, mask, new_tokens: int):
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor(ids), attention_mask=torch.tensor(mask),
                             max_new_tokens=new_tokens, do_sample=False, pad_token_id=PAD)
    return out.numpy()[:, ids.shape[1]:]


def our_logits(config, params, ids, mask):
    import jax.numpy as jnp

    from jaxrl_suite.models import CausalLM

    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    logits, _ = CausalLM(config).apply(params, jnp.asarray(ids), jnp.asarray(positions),
                                       jnp.asarray(mask, bool))
    return np.asarray(logits)


def our_greedy(config, params, ids, mask, new_tokens: int):
    import jax
    import jax.numpy as jnp

    from jaxrl_suite.models import CausalLM
    from jaxrl_suite.sampling import KVCacheSampler

    sampler = KVCacheSampler(CausalLM(config), max_new_tokens=new_tokens, eos_id=-1, pad_id=0,
                             greedy=True)
    out = sampler(params, jnp.asarray(ids), jnp.asarray(mask), jax.random.PRNGKey(0))
    return np.asarray(out.tokens)


def measure(family: str, root: Path, new_tokens: int = 16) -> dict:
    from jaxrl_suite.models.hf import load_hf_checkpoint

    model = save_tiny_checkpoint(family, root / family)
    config, params, _ = load_hf_checkpoint(root / family)
    ids, mask = fixed_batch()
    real = mask.astype(bool)
    ref, ours = torch_logits(model, ids, mask)[real], our_logits(config, params, ids, mask)[real]
    want, got = torch_greedy(model, ids, mask, new_tokens), our_greedy(config, params, ids, mask,
                                                                       new_tokens)
    return {"family": family, "max_abs_logit_err": float(np.abs(ours - ref).max()),
            "max_abs_logit": float(np.abs(ref).max()),
            "greedy_tokens_equal": int((want == got).sum()), "greedy_tokens": int(want.size)}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="results/hf_parity.json")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        rows = [measure(f, Path(tmp)) for f in ("llama", "qwen2", "qwen3")]
    print(f"{'family':8s} {'max |Δlogit|':>14s} {'max |logit|':>12s} {'greedy tokens equal':>20s}")
    for r in rows:
        print(f"{r['family']:8s} {r['max_abs_logit_err']:14.2e} {r['max_abs_logit']:12.2f} "
              f"{r['greedy_tokens_equal']:>12d} / {r['greedy_tokens']}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
