"""Config -> objects: policy sources, chat formatting, algorithm settings, validation errors."""

import jax
import numpy as np
import pytest
from flax import nnx

from configs.grpo_addition import get_config
from rljax.config import validate_config
from rljax.core.batch import make_batch
from rljax.core.transform import Context
from rljax.models.tokenizer import ByteTokenizer
from rljax.train.builders import (
    build_algorithm,
    build_dare_settings,
    build_lope,
    build_policy,
    build_replay,
    build_rollout_config,
    build_rollout_weights,
    build_task,
    prompt_format,
)


def tiny_config():
    config = get_config()
    config.model.update(d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32)
    return config


def test_scratch_policy_uses_the_byte_tokenizer_vocabulary():
    tokenizer, model_config, _, params = build_policy(tiny_config())
    assert isinstance(tokenizer, ByteTokenizer)
    assert model_config.vocab_size == tokenizer.vocab_size == 259
    assert params["embed"][...].shape == (259, 16)


def test_unknown_checkpoint_path_names_the_key(tmp_path):
    config = tiny_config()
    config.model.checkpoint = str(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="model.checkpoint="):
        build_policy(config)


class ChatTokenizer(ByteTokenizer):
    def apply_chat_template(self, messages):
        return f"<user>{messages[0]['content']}</user>"


def test_prompt_format_applies_the_chat_template_without_bos():
    config = tiny_config()
    assert prompt_format(config, ByteTokenizer()) == (None, True)
    config.task.chat_template = True
    fmt, add_bos = prompt_format(config, ChatTokenizer())
    assert fmt("1+2=") == "<user>1+2=</user>" and add_bos is False
    with pytest.raises(ValueError, match="no chat template"):
        prompt_format(config, ByteTokenizer())


def test_task_gets_its_own_settings_only():
    config = tiny_config()
    task = build_task(config)
    assert (task.min_digits, task.max_digits, task.seed) == (1, 2, config.seed)


def test_algorithm_from_config_and_a_setting_it_does_not_take():
    config = tiny_config()
    assert build_algorithm(config).aggregation == "token-mean"
    config.algorithm.unlock()
    config.algorithm.tau = 0.5
    with pytest.raises(ValueError, match="do not fit algorithm.name='grpo'"):
        build_algorithm(config)


def test_settings_that_mean_the_generation_budget_get_it_not_the_batch_width():
    """DAPO's overlong punishment (L_max, L_cache = 4) on a batch trimmed to 4 completion
    columns (`train.pad_multiple`): a 4-token completion is within budget 8, so no penalty;
    had L_max defaulted to the width it would get the full -1."""
    config = tiny_config()
    config.rollout.update(n_samples=2, max_new_tokens=8)
    config.algorithm = {"name": "dapo", "cache_len": 4}
    algorithm = build_algorithm(config)
    batch = make_batch(
        prompt_tokens=np.ones((2, 1)),
        prompt_mask=np.ones((2, 1)),
        completion_tokens=np.ones((2, 4)),
        completion_mask=np.ones((2, 4)),
        group_id=np.array([0, 0]),
        rewards=np.array([1.0, 0.0]),
    )
    ctx = Context(step=0, rng=jax.random.PRNGKey(0), extras={})
    out, _, _ = algorithm.transform.apply(batch, algorithm.transform.init(), ctx)
    np.testing.assert_allclose(out.rewards, [1.0, 0.0])
    # Dr. GRPO's normaliser needs no algorithm.max_len either; PPO's token-mean takes none.
    config.algorithm = {"name": "dr_grpo"}
    assert build_algorithm(config).aggregation == "seq-mean-token-sum-norm"
    config.algorithm = {"name": "ppo"}
    assert build_algorithm(config).aggregation == "token-mean"


@pytest.mark.parametrize(
    "key,value,match",
    [
        ("rollout.n_samples", 1, "at least 2 samples"),
        ("train.steps", 0, "train.steps=0"),
        ("rollout.max_new_tokens", 0, "max_new_tokens=0"),
        ("rollout.weight_correction", "magic", "weight_correction='magic' is unknown"),
        ("rollout.aqn_sigma_start", -1.0, "aqn_sigma_start=-1.0"),
        ("reward.workers", -1, "reward.workers=-1"),
        ("prompt_selection.name", "dapr", "prompt_selection.name='dapr' is unknown"),
        ("replay.name", "per", "replay.name='per' is unknown"),
        ("replay.tau", 0.0, "tau=0.0"),
        ("lope.num_perturbed", -1, "num_perturbed=-1"),
        ("reward.token_level", True, "use algorithm.name='ppo', not 'grpo'"),
        ("lope.max_prompt_len", 8, "lope.max_prompt_len=8 must exceed task.max_prompt_len=8"),
        ("reward.timeout_s", -2.0, "reward.timeout_s=-2.0"),
    ],
)
def test_validate_config_names_the_key(key, value, match):
    config = tiny_config()
    section, field = key.split(".")
    config[section][field] = value
    if section == "replay":
        config.replay.name = config.replay.name if field == "name" else "fresh_per"
    if key == "lope.max_prompt_len":
        config.lope.num_perturbed = 2
    with pytest.raises(ValueError, match=match):
        validate_config(config)


def test_rollout_weights_and_correction_from_config():
    config = tiny_config()
    config.rollout.update(weight_format="mxfp4", weight_correction="outlier_fallback")
    config.rollout.update(outlier_fraction=0.05, aqn_sigma_start=0.01)
    weights = build_rollout_weights(config)
    assert (weights.format, weights.correction, weights.outlier_fraction) == (
        "mxfp4",
        "outlier_fallback",
        0.05,
    )
    assert (weights.aqn_sigma_start, weights.total_steps) == (0.01, config.train.steps)
    config.rollout_correction = {"name": "tis", "cap": 1.5}
    config.rollout.n_samples = 2
    algorithm = build_algorithm(config)
    rollout = np.log(np.array([[0.5, 0.1], [0.2, 0.4]], np.float32))
    old = np.log(np.array([[0.25, 0.3], [0.2, 0.1]], np.float32))
    batch = make_batch(
        prompt_tokens=np.zeros((2, 1)),
        prompt_mask=np.ones((2, 1)),
        completion_tokens=np.zeros((2, 2)),
        completion_mask=np.ones((2, 2)),
        group_id=np.array([0, 0]),
        rewards=np.array([1.0, 0.0]),
        rollout_logprobs=rollout,
        old_logprobs=old,
    )
    ctx = Context(step=0, rng=jax.random.PRNGKey(0), extras={})
    out, _, metrics = algorithm.transform.apply(batch, algorithm.transform.init(), ctx)
    np.testing.assert_allclose(
        out.extras["is_weight"], np.minimum(np.exp(old - rollout), 1.5), rtol=1e-6
    )
    assert "tis/capped_frac" in metrics


@pytest.mark.parametrize(
    "section,match",
    [
        ({"name": "vtrace"}, "rollout_correction.name='vtrace' is unknown"),
        ({"name": "mis", "cap": 2.0}, "unknown config key rollout_correction.cap"),
        ({"name": "tis", "cap": -1.0}, "cap=-1.0"),
    ],
)
def test_bad_rollout_correction_is_named(section, match):
    config = tiny_config()
    config.rollout_correction = section
    with pytest.raises(ValueError, match=match):
        validate_config(config)


def test_prompt_selection_checks_pool_size_and_uec():
    config = tiny_config()
    config.prompt_selection.update(name="heapa", pool_size=8)
    with pytest.raises(ValueError, match="pool_size=8 is smaller than a batch"):
        validate_config(config)
    config.prompt_selection.pool_size = 256
    validate_config(config)
    config.algorithm = {"name": "uec_rl"}
    with pytest.raises(ValueError, match="does not combine with UEC-RL"):
        validate_config(config)


def test_dare_replay_and_lope_settings_from_config():
    config = tiny_config()
    config.prompt_selection.update(name="dare", pool_size=256, records=64, kappa=4.0)
    settings = build_dare_settings(config)
    assert (settings.capacity, settings.kappa, settings.clip) == (64, 4.0, 5.0)
    config.prompt_selection.kappa = -1.0
    with pytest.raises(ValueError, match="kappa=-1.0"):
        validate_config(config)
    assert build_replay(config) is None
    config.replay.update(name="fresh_per", capacity=32, tau=10.0, groups=0)
    replay = build_replay(config)
    assert (replay.buffer.settings.capacity, replay.buffer.settings.tau) == (32, 10.0)
    assert replay.groups == config.train.prompts_per_step
    assert build_lope(config, build_task(config), ByteTokenizer(), 1) is None
    config.lope.update(num_perturbed=3, rollouts_per_perturbed=2, max_prompt_len=40)
    lope = build_lope(config, build_task(config), ByteTokenizer(), 1)
    assert (lope.settings.num_perturbed, lope.prompt_len) == (3, 40)
    config.algorithm = {"name": "uec_rl"}
    config.prompt_selection.name = "none"
    with pytest.raises(ValueError, match="does not combine with UEC-RL's own replay"):
        validate_config(config)


def test_cuts_settings_reach_the_sampler():
    config = tiny_config()
    config.rollout.update(cuts_top_k=4, cuts_fraction=0.25)
    sampling = build_rollout_config(config, ByteTokenizer()).sampling
    assert (sampling.cuts_top_k, sampling.cuts_fraction) == (4, 0.25)
    config.rollout.cuts_fraction = 2.0
    with pytest.raises(ValueError, match="cuts_fraction"):
        build_rollout_config(config, ByteTokenizer())


def test_model_memory_settings_and_experts_from_config():
    config = tiny_config()
    config.model.update(remat="block", attention_chunk=8, num_experts=4, experts_per_token=1)
    _, model_config, graphdef, params = build_policy(config)
    assert nnx.merge(graphdef, params).layers.attn.config.attention_chunk == 8
    assert (model_config.remat, model_config.num_experts, model_config.experts_per_token) == (
        "block",
        4,
        1,
    )
    assert nnx.merge(graphdef, params).config == model_config
    config.model.remat = "everything"
    with pytest.raises(ValueError, match="remat='everything' is unknown"):
        build_policy(config)
