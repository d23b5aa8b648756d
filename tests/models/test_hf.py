"""Hugging Face checkpoints: our loader against transformers' own PyTorch Llama / Qwen2 / Qwen3.

Tiny random models (2 layers, hidden size 64, GQA 4:2) are built from configs, saved with
`save_pretrained` next to a small byte-level BPE tokenizer trained here (no download), loaded
with `load_hf_checkpoint`, and compared with the PyTorch forward and greedy generation.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tokenizers

torch = pytest.importorskip("torch")  # the [hf] extra; .ci/run installs it
transformers = pytest.importorskip("transformers")

from lm_helpers import load_hf_parity  # noqa: E402

from jaxrl_suite.models import CausalLM  # noqa: E402
from jaxrl_suite.models.hf import (  # noqa: E402
    HFCheckpointError,
    config_from_hf,
    load_hf_checkpoint,
    load_hf_config,
    save_hf_checkpoint,
)

FAMILIES = ("llama", "qwen2", "qwen3")


hp = load_hf_parity()
PAD, EOS = hp.PAD, hp.EOS
_tokenizer, _torch_model, _batch = hp.tiny_tokenizer, hp.tiny_torch_model, hp.fixed_batch
_torch_logits, _our_logits = hp.torch_logits, hp.our_logits


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """family -> (torch model, checkpoint dir). Llama is saved in 5 shards (index file)."""
    root = tmp_path_factory.mktemp("hf")
    return {f: (hp.save_tiny_checkpoint(f, root / f), root / f) for f in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_and_greedy_generation_match_transformers(checkpoints, family):
    model, path = checkpoints[family]
    config, params, tok = load_hf_checkpoint(path)
    assert (config.qkv_bias, config.qk_norm) == (family == "qwen2", family == "qwen3")
    assert config.tie_embeddings == (family != "llama") and config.n_kv_heads == 2
    assert config.rope_theta == (5e5 if family == "llama" else 1e6)
    # the loaded tree is exactly the one CausalLM.init builds
    init = CausalLM(config).init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))
    assert jax.tree.structure(init) == jax.tree.structure(params)
    for a, b in zip(jax.tree.leaves(init), jax.tree.leaves(params), strict=True):
        assert a.shape == b.shape and b.dtype == np.float32

    ids, mask = _batch()
    ref, ours = _torch_logits(model, ids, mask), _our_logits(config, params, ids, mask)
    real = mask.astype(bool)
    assert np.abs(ref[real]).max() > 1.0  # logits of a visible scale, not all ~0
    np.testing.assert_allclose(ours[real], ref[real], atol=1e-4, rtol=0)

    want = hp.torch_greedy(model, ids, mask, 16)
    np.testing.assert_array_equal(hp.our_greedy(config, params, ids, mask, 16), want)
    assert want.shape == (3, 16) and len(set(want[0].tolist())) > 1  # not one repeated token

    # the tokenizer came from the same directory, as it was saved: its tokenizer.json read by the
    # tokenizers library (transformers 5's AutoTokenizer would pick the model type's class,
    # Qwen2Tokenizer for qwen2, which pre-tokenizes digits otherwise)
    text = "12+34=<answer>46</answer>"
    saved = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
    assert tok.encode(text) == saved.encode(text, add_special_tokens=False).ids
    assert tok.decode(tok.encode(text) + [tok.eos_id, 5]) == text
    assert tok.eos_id == EOS and tok.pad_id == PAD


@pytest.mark.parametrize("family", FAMILIES)
def test_save_round_trip(checkpoints, family, tmp_path):
    model, path = checkpoints[family]
    config, params, tok = load_hf_checkpoint(path)
    # perturb so the round trip carries our values, not the original file's
    params = jax.tree.map(lambda x: x + 0.01 * np.sign(x), params)
    out = save_hf_checkpoint(params, config, tmp_path / "rt", tokenizer=tok, max_shard_bytes=40_000)
    assert (out / "model.safetensors.index.json").exists()  # sharded by the small limit
    config2, params2, tok2 = load_hf_checkpoint(out)
    assert config2 == config
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2), strict=True):
        np.testing.assert_array_equal(np.asarray(a), b)
    assert tok2.encode("the fox") == tok.encode("the fox")

    # transformers loads what we saved as the same architecture, with the same logits
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(reloaded) is type(model)
    ids, mask = _batch()
    real = mask.astype(bool)
    np.testing.assert_allclose(_torch_logits(reloaded, ids, mask)[real],
                               _our_logits(config, params, ids, mask)[real], atol=1e-4, rtol=0)

    # saving again into the same directory without sharding leaves no stale shard behind
    save_hf_checkpoint(params, config, out, tokenizer=tok)
    assert sorted(p.name for p in out.glob("*.safetensors")) == ["model.safetensors"]
    assert not (out / "model.safetensors.index.json").exists()


def test_bfloat16_checkpoint_loads_as_float32(tmp_path):
    bf16 = _torch_model("qwen2").to(torch.bfloat16)
    bf16.save_pretrained(tmp_path)
    _tokenizer().save_pretrained(tmp_path)
    config, params, _ = load_hf_checkpoint(tmp_path)
    q = params["params"]["layer_1"]["attn"]["q"]
    want = bf16.model.layers[1].self_attn.q_proj
    np.testing.assert_array_equal(q["kernel"], want.weight.detach().float().numpy().T)
    np.testing.assert_array_equal(q["bias"], want.bias.detach().float().numpy())
    assert q["kernel"].dtype == np.float32
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"


def _copy(path, dst):
    import shutil

    shutil.copytree(path, dst)
    return dst


def _edit_config(path, **fields):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(fields)
    (path / "config.json").write_text(json.dumps(cfg))


def test_errors_name_the_field_file_or_tensor(checkpoints, tmp_path):
    _, qwen = checkpoints["qwen2"]
    _, llama = checkpoints["llama"]

    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_hf_checkpoint(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="config.json is missing"):
        load_hf_checkpoint(tmp_path)

    gpt2 = _copy(qwen, tmp_path / "gpt2")
    _edit_config(gpt2, model_type="gpt2")
    with pytest.raises(HFCheckpointError, match="'model_type'='gpt2' is not supported"):
        load_hf_checkpoint(gpt2)

    scaled = _copy(llama, tmp_path / "scaled")
    _edit_config(scaled, rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8})
    with pytest.raises(HFCheckpointError, match="'rope_parameters.rope_type'='llama3'"):
        load_hf_checkpoint(scaled)

    wide = _copy(qwen, tmp_path / "wide")
    _edit_config(wide, intermediate_size=96)
    with pytest.raises(HFCheckpointError,
                       match=r"tensor 'model.layers.0.mlp.gate_proj.weight' has shape \(128, 64\)"
                             r" but config.json implies \(96, 64\)"):
        load_hf_checkpoint(wide)

    shard = _copy(llama, tmp_path / "shard")
    index = json.loads((shard / "model.safetensors.index.json").read_text())
    lost = sorted(set(index["weight_map"].values()))[-1]
    (shard / lost).unlink()
    with pytest.raises(FileNotFoundError, match=f"names shard {lost}, which is missing"):
        load_hf_checkpoint(shard)

    from safetensors.numpy import load_file, save_file

    missing = _copy(qwen, tmp_path / "missing")
    tensors = load_file(missing / "model.safetensors")
    del tensors["model.layers.1.self_attn.k_proj.bias"]
    save_file(tensors, missing / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(HFCheckpointError, match="missing tensor 'model.layers.1.self_attn.k_proj"):
        load_hf_checkpoint(missing)

    no_tok = _copy(qwen, tmp_path / "no_tok")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (no_tok / f).unlink()
    with pytest.raises(FileNotFoundError, match="no tokenizer files"):
        load_hf_checkpoint(no_tok)
    config, _, tok = load_hf_checkpoint(no_tok, tokenizer=False)
    assert tok is None and config == load_hf_config(qwen)

    for msg in (str(e) for e in _all_errors(qwen)):
        assert "\n" not in msg


def _all_errors(path):
    cases = [dict(model_type="bert"), dict(hidden_act="gelu"), dict(attention_bias=True),
             dict(use_sliding_window=True), dict(num_attention_heads=3)]
    base = json.loads((path / "config.json").read_text())
    for case in cases:
        with pytest.raises(HFCheckpointError) as e:
            config_from_hf({**base, **case})
        assert next(iter(case)) in str(e.value)  # names the field
        yield e.value


def test_real_config_files_map_to_the_published_sizes():
    """config.json of Qwen2.5-0.5B and TinyLlama-1.1B as published (transformers 4 layout:
    top-level rope_theta, rope_scaling null); their parameter counts are the published ones."""
    from jaxrl_suite.models import LMConfig
    from jaxrl_suite.models.hf import num_params

    qwen = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
            "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
            "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
            "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
            "rope_scaling": None, "sliding_window": 32768, "use_sliding_window": False,
            "max_window_layers": 21, "tie_word_embeddings": True, "torch_dtype": "bfloat16"}
    cfg = config_from_hf(qwen)
    assert cfg == LMConfig(vocab_size=151936, d_model=896, n_layers=24, n_heads=14, n_kv_heads=2,
                           d_ff=4864, max_len=32768, rope_theta=1e6, tie_embeddings=True,
                           norm_eps=1e-6, qkv_bias=True)
    assert num_params(cfg) == 494_032_768  # "0.49B" on the model card
    llama = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
             "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
             "num_attention_heads": 32, "num_key_value_heads": 4, "vocab_size": 32000,
             "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
             "rope_scaling": None, "tie_word_embeddings": False, "attention_bias": False}
    cfg = config_from_hf(llama)
    assert (cfg.n_kv_heads, cfg.resolved_head_dim, cfg.tie_embeddings) == (4, 64, False)
    assert num_params(cfg) == 1_100_048_384  # TinyLlama-1.1B
