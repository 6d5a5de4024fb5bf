"""rljax.config: the schema's defaults and docs, default_config, and validate_config's filling."""

import pytest
from ml_collections import ConfigDict

from configs.grpo_addition import get_config
from rljax.config import OPEN_SECTIONS, SCHEMA, Key, default_config, validate_config

# The grpo_addition recipe as it was before the schema moved into rljax (its full content),
# the reference for the defaults.
RECIPE_BEFORE = {
    "seed": 0,
    "run_dir": "runs/grpo_addition",
    "model": dict(
        checkpoint="",
        d_model=128,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        d_ff=384,
        rope_theta=10000.0,
        dtype="float32",
        param_dtype="float32",
        num_experts=0,
        experts_per_token=2,
        expert_d_ff=0,
        remat="none",
        attention_chunk=0,
    ),
    "task": dict(
        name="addition",
        min_digits=1,
        max_digits=2,
        max_prompt_len=8,
        eval_size=512,
        chat_template=False,
    ),
    "sft": dict(steps=800, batch_size=64, learning_rate=1e-3),
    "rollout": dict(
        max_new_tokens=5,
        n_samples=8,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_refill_rounds=0,
        weight_format="none",
        weight_correction="none",
        macro_block=128,
        outlier_fraction=0.01,
        aqn_sigma_start=0.0,
        aqn_sigma_end=1e-4,
        aqn_stages=10,
        cuts_top_k=0,
        cuts_ratio=2.718281828459045,
        cuts_fraction=0.5,
    ),
    "rollout_correction": dict(name="none"),
    "reward": dict(workers=2, kind="process", timeout_s=60.0, max_abs=1e6, token_level=False),
    "prompt_selection": dict(
        name="none",
        pool_size=0,
        low_fraction=0.5,
        records=2048,
        kappa=20.0,
        clip=5.0,
        ess_threshold=2.0,
        threshold=0.7,
        decay=0.9,
        review=0.2,
        min_updates=5,
    ),
    "replay": dict(
        name="none",
        capacity=1024,
        groups=0,
        every=1,
        tau=500.0,
        alpha=0.6,
        beta_start=0.4,
        beta_end=1.0,
        beta_steps=1000,
    ),
    "lope": dict(
        num_perturbed=0, rollouts_per_perturbed=4, min_words=4, max_words=12, max_prompt_len=96
    ),
    "algorithm": dict(
        name="grpo",
        clip_eps=0.2,
        clip_eps_high=0.2,
        kl_coef=0.0,
        kl_estimator="k3",
        entropy_coef=0.0,
        normalize_std=True,
        aggregation="token-mean",
    ),
    "train": dict(
        steps=300,
        prompts_per_step=64,
        learning_rate=1e-4,
        warmup_steps=5,
        max_grad_norm=1.0,
        weight_decay=0.0,
        epochs=1,
        minibatches=2,
        microbatches=1,
        vocab_chunk=8192,
        pack_ratio=0.0,
        eval_every=50,
        checkpoint_every=50,
        max_checkpoints=2,
        max_staleness=0,
        max_consecutive_skips=5,
        log_samples=0,
    ),
    "mesh": dict(data=-1, fsdp=1, tensor=1, expert=1, sampler_devices=0),
}
# Keys the old recipe left out, whose defaults lived in rljax.train.validation's _OPTIONAL.
OPTIONAL_BEFORE = {"critic.separate": False, "task.max_answer_len": 32}
# Keys added after the old recipe, with their defaults.
ADDED_SINCE = {
    "rollout.engine": "continuous",
    "rollout.slots": 64,
    "rollout.decode_steps": 16,
    "rollout.admit_after": 0,
    "rollout.span_bucket": 128,
    "rollout.prefill_rows": 8,
    "rollout.stop_strings": (),
    "rollout.extra_eos_ids": (),
    "train.old_logprobs": "auto",
    "train.pad_multiple": 16,
    "train.compilation_cache": "~/.cache/rljax/jax",
    "train.allow_config_change": False,
    "train.allow_unverified_checkpoint": False,
    "lora.rank": 0,
    "lora.alpha": 16.0,
    "lora.targets": ("q", "k", "v", "o"),
    "model.attention_impl": "einsum",
    "model.scan_layers": True,
    "lora.base_quant": "none",
    "lora.sampler": "merged",
    "env.chat_format": "plain",
    "env.time_limit_s": 5.0,
    "env.workers": 8,
    "env.overlap": False,
    "env.isolation": "thread",
    "sft.scripted_episodes": 4096,
    "train.top_entropy_fraction": 1.0,
    "teacher.run_dir": "",
    "teacher.step": -1,
    "teacher.top_k": 0,
    "train.overlap": "off",
    "log.backends": "jsonl,tensorboard",
    "log.project": "rljax",
    "log.name": "",
}
# Keys added with the diffusion policy on the driver (model.kind; the others are read by a
# model.kind="diffusion" run only), at their defaults in a causal recipe.
DIFFUSION_KEYS = {
    "model.kind": "causal",
    "sft.warmup_steps": 0,
    "sft.weight_decay": 0.0,
    "sft.mask_eps": 1e-3,
    "rollout.block_size": 0,
    "rollout.steps_per_block": 0,
    "rollout.remasking": "low_confidence",
    "rollout.block_sizes": (),
}
# Defaults that are not the recipe's choice (the recipe sets them).
RECIPE_ONLY = {"run_dir"}


def flat(config) -> dict:
    d = config.to_dict() if isinstance(config, ConfigDict) else config
    out = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            out[key] = value
    return out


def test_default_config_equals_the_old_recipe_where_they_overlap():
    defaults, before = flat(default_config()), flat(RECIPE_BEFORE)
    overlap = (set(defaults) & set(before)) - RECIPE_ONLY
    assert len(overlap) > 90
    assert {k: defaults[k] for k in overlap} == {k: before[k] for k in overlap}
    assert {k: defaults[k] for k in OPTIONAL_BEFORE} == OPTIONAL_BEFORE
    # What the default leaves out is what the open sections' callables own.
    for key in set(before) - set(defaults):
        assert key.split(".")[0] in OPEN_SECTIONS, key


def test_the_recipe_is_the_old_recipe_plus_the_optional_defaults():
    assert flat(get_config()) == {
        **flat(RECIPE_BEFORE),
        **OPTIONAL_BEFORE,
        **ADDED_SINCE,
        **DIFFUSION_KEYS,
    }


def test_every_key_has_a_one_line_doc_and_a_default_in_its_range():
    keys = [(name, entry) for name, entry in SCHEMA.items() if isinstance(entry, Key)]
    for section, entries in SCHEMA.items():
        if isinstance(entries, dict):
            keys += [(f"{section}.{k}", spec) for k, spec in entries.items()]
    assert len(keys) > 90
    for name, spec in keys:
        assert isinstance(spec, Key), name
        assert spec.doc.strip() and "\n" not in spec.doc, name
        if spec.choices is not None:
            assert spec.default in spec.choices, name
        if spec.min is not None:
            assert spec.default >= spec.min, name
        if spec.gt is not None:
            assert spec.default > spec.gt, name
        if spec.max is not None:
            assert spec.default <= spec.max, name
    for section in OPEN_SECTIONS:
        assert "name" in SCHEMA[section]


def test_validate_config_fills_a_missing_key_with_its_default_and_copies():
    config = get_config()
    del config.train["pack_ratio"]
    del config["critic"]
    config.task = ConfigDict(dict(name="addition", max_digits=2))
    full = validate_config(config)
    assert full.train.pack_ratio == SCHEMA["train"]["pack_ratio"].default
    assert full.critic.separate is False
    assert full.task.max_prompt_len == 8 and full.task.chat_template is False
    assert full.task.max_digits == 2  # the task's own setting is kept, not defaulted
    assert "min_digits" not in full.task
    assert "pack_ratio" not in config.train and "critic" not in config  # not modified
    assert flat(validate_config(ConfigDict({}))) == flat(validate_config(default_config()))


def test_validate_config_returns_ints_of_float_keys_as_floats():
    config = get_config()
    config.train = {**config.train.to_dict(), "learning_rate": 1}
    full = validate_config(config)
    assert isinstance(full.train.learning_rate, float) and full.train.learning_rate == 1.0


@pytest.mark.parametrize(
    "key,value,expected",
    [
        ("reward.workers", -1, "reward.workers=-1 must be >= 0 (0 only with reward.kind='inline')"),
        (
            "reward.kind",
            "fiber",
            "reward.kind='fiber' is unknown; use one of ['process', 'thread', 'inline']",
        ),
        (
            "reward.workers",
            0,
            "reward.kind='process' needs reward.workers >= 1; use reward.kind='inline' to "
            "score in-process",
        ),
        ("reward.max_abs", 0.0, "reward.max_abs=0.0 must be > 0"),
        ("replay.name", "per", "replay.name='per' is unknown; use 'none' or 'fresh_per'"),
        ("train.pack_ratio", -0.5, "train.pack_ratio=-0.5 must be in [0, 1] (0: off)"),
        ("rollout.top_p", 0.0, "rollout.top_p=0.0 must be in (0, 1] (1 disables it)"),
    ],
)
def test_the_schemas_ranges_and_choices_are_checked(key, value, expected):
    section, name = key.split(".")
    config = get_config()
    config[section] = {**config[section].to_dict(), name: value}
    with pytest.raises(ValueError) as info:
        validate_config(config)
    assert str(info.value) == expected


def test_inline_rewards_need_no_workers():
    config = get_config()
    config.reward.update(kind="inline", workers=0)
    assert validate_config(config).reward.workers == 0
    config.reward.kind = "thread"
    with pytest.raises(ValueError, match=r"^reward.kind='thread' needs reward.workers >= 1"):
        validate_config(config)
