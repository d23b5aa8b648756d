"""The rollout-engine registry (sampling/engines.py): each name builds its engine with the
config's options, one place checks them, and a new engine is one function and a registry line.
Nothing here compiles (the engines trace on their first call)."""

import pytest

from jaxrl_suite.algorithms.grpo_config import GRPOConfig, MemoryConfig, rollout_config
from jaxrl_suite.core.config import ConfigError
from jaxrl_suite.envs.text.tokenizer import load_tokenizer
from jaxrl_suite.models import CausalLM, LMConfig
from jaxrl_suite.models.diffusion_lm import DiffusionLM
from jaxrl_suite.sampling import (
    ContinuousSampler,
    DiffusionSampler,
    KVCacheSampler,
    SpeculativeSampler,
)
from jaxrl_suite.sampling.engines import ENGINES, EngineOptions, RolloutConfig, make_engine

TOK = load_tokenizer()
MODEL = CausalLM(LMConfig(vocab_size=TOK.vocab_size, d_model=32, n_layers=1, n_heads=2,
                          n_kv_heads=2, d_ff=64, max_len=64))


def test_each_engine_is_built_with_the_configs_options():
    static = make_engine(MODEL, rollout_config(GRPOConfig(temperature=0.7, top_k=5)), TOK)
    assert isinstance(static, KVCacheSampler)
    assert (static.temperature, static.top_k) == (pytest.approx(0.7), 5)
    cont = make_engine(MODEL, rollout_config(GRPOConfig(rollout=EngineOptions(
        engine="continuous", slots=4, schedule="lpt"))), TOK)
    assert isinstance(cont, ContinuousSampler) and cont.slots == 4
    spec = make_engine(MODEL, rollout_config(GRPOConfig(rollout=EngineOptions(
        engine="speculative", draft_k=2, drafter_d_model=32))), TOK)
    assert isinstance(spec, SpeculativeSampler) and spec.draft_k == 2
    assert spec.drafter.config.d_model == 32 and spec.drafter.config.n_layers == 1
    shared = KVCacheSampler(MODEL, max_new_tokens=8, eos_id=TOK.eos_id, pad_id=TOK.pad_id)
    assert make_engine(MODEL, RolloutConfig(), TOK, shared=shared) is shared
    assert isinstance(make_engine(MODEL, RolloutConfig(engine="continuous", slots=2), TOK,
                                  shared=shared), ContinuousSampler)  # shared: static only


@pytest.mark.parametrize("fields, match", [
    (dict(engine="vllm"), "grpo.rollout.engine must be one of"),
    (dict(slots=4), "grpo.rollout.slots applies to grpo.rollout.engine='continuous' only"),
    (dict(engine="continuous"), "needs grpo.rollout.slots > 0"),
    (dict(engine="continuous", slots=4, rollout_micro_batch=8),
     "grpo.memory.rollout_micro_batch does not apply"),
    (dict(engine="speculative", draft_k=3), "grpo.rollout.draft_k must be null"),
    (dict(dtype="float16"), "grpo.rollout.dtype must be null, 'float32' or 'bfloat16'"),
])
def test_one_line_errors_name_the_grpo_key(fields, match):
    with pytest.raises(ValueError, match=match) as err:
        RolloutConfig(**fields)
    assert "\n" not in str(err.value)
    options = {k: v for k, v in fields.items() if k != "rollout_micro_batch"}
    memory = MemoryConfig(rollout_micro_batch=fields.get("rollout_micro_batch", 0))
    with pytest.raises(ValueError, match=match):  # GRPOConfig checks through rollout_config
        GRPOConfig(rollout=EngineOptions(**options), memory=memory)


def test_the_diffusion_engine_takes_a_diffusion_lm_and_its_decoding_options():
    diffusion = DiffusionLM(MODEL.config)
    sampler = make_engine(diffusion, RolloutConfig(engine="diffusion", max_new_tokens=8,
                                                   temperature=0.5), TOK,
                          steps=4, order="random", block_size=4, greedy=True)
    assert isinstance(sampler, DiffusionSampler)
    assert (sampler.steps, sampler.block_size, sampler.greedy) == (4, 4, True)
    with pytest.raises(ConfigError,
                       match="'grpo.rollout.engine': 'diffusion' needs a masked-diffusion"):
        make_engine(MODEL, RolloutConfig(engine="diffusion"), TOK)  # a causal LM
    with pytest.raises(ConfigError, match="'grpo.top_k' does not apply"):
        make_engine(diffusion, RolloutConfig(engine="diffusion", top_k=5), TOK)


def test_a_new_engine_is_one_function_and_a_registry_line():
    @ENGINES.register("echo_static")
    def echo(model, c, tokenizer, **_):
        return KVCacheSampler(model, max_new_tokens=c.max_new_tokens, eos_id=tokenizer.eos_id,
                              pad_id=tokenizer.pad_id, greedy=True)

    try:
        sampler = make_engine(MODEL, RolloutConfig(engine="echo_static", max_new_tokens=6), TOK)
        assert isinstance(sampler, KVCacheSampler) and sampler.greedy
    finally:
        ENGINES.unregister("echo_static")
    with pytest.raises(ValueError, match="grpo.rollout.engine must be one of"):
        RolloutConfig(engine="echo_static")
