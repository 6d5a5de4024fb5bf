"""validate_config: one-line errors naming the key and the fix, before anything is compiled."""

import glob
import importlib
import json
import os

import jax
import numpy as np
import pytest
from ml_collections import ConfigDict

from configs.grpo_addition import get_config
from rljax.config import validate_config
from rljax.train.builders import ALGORITHMS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = sorted(
    os.path.basename(p)[:-3]
    for p in glob.glob(os.path.join(ROOT, "configs", "*.py"))
    if os.path.basename(p) != "__init__.py"
)

# Compilation events (tracing, lowering, XLA compile: all fire even when the persistent cache
# then skips the XLA compile) seen while `COMPILES["on"]`: one listener for the whole module
# (jax has no public way to remove one).
COMPILES = {"on": False, "events": []}


def _on_event(name, duration, **kwargs):
    if COMPILES["on"] and name.startswith("/jax/core/compile/"):  # trace, lower or compile
        COMPILES["events"].append(name)


jax.monitoring.register_event_duration_secs_listener(_on_event)


def with_value(config, key, value):
    """A copy of `config` with `key` (dotted) set to `value`, bypassing ConfigDict's own type
    checks (as a config file that builds its sections from dicts does)."""
    d = config.to_dict()
    *path, last = key.split(".")
    node = d
    for part in path:
        node = node[part]
    node[last] = value
    return ConfigDict(d)


def error_of(config) -> str:
    """The message of the ValueError validate_config raises; asserts it is one line."""
    with pytest.raises(ValueError) as info:
        validate_config(config)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("name", CONFIGS)
def test_every_config_passes(name, tmp_path):
    config = importlib.import_module(f"configs.{name}").get_config()
    if name == "ppo_mbpp":  # its data paths are placeholders set on the command line
        config.task.update(train_path=str(tmp_path / "train.jsonl"), test_path=None)
    validate_config(config)


def _diffusion_config():
    return importlib.import_module("configs.diffusion_lm").get_config()


@pytest.mark.parametrize(
    "recipe,key,value,expected",
    [
        (
            "diffusion",
            "model.kind",
            "difusion",
            "model.kind='difusion' is unknown; use 'causal' or 'diffusion'",
        ),
        (
            "diffusion",
            "algorithm.name",
            "grpo",
            "algorithm.name='grpo' is a model.kind='causal' algorithm; set "
            "--config.model.kind=causal or choose one of ['daca', 'diffu_grpo', 'rldf', 'rspo', "
            "'wd1']",
        ),
        ("causal", "algorithm.name", "rldf", "algorithm.name='rldf' is a model.kind='diffusion'"),
        (
            "causal",
            "rollout.block_size",
            2,
            "rollout.block_size=2 applies to model.kind='diffusion' only; remove it or set "
            "--config.model.kind=diffusion",
        ),
        (
            "diffusion",
            "model.checkpoint",
            "smollm2",
            "model.checkpoint='smollm2' is not supported with model.kind='diffusion' (yet); set "
            "model.checkpoint=''",
        ),
        (
            "diffusion",
            "train.microbatches",
            2,
            "train.microbatches=2 is not supported with model.kind='diffusion' (yet); set "
            "train.microbatches=1",
        ),
        (
            "diffusion",
            "rollout.block_size",
            3,
            "rollout.block_size=3 must divide rollout.max_new_tokens=4 (0: one block)",
        ),
        ("diffusion", "rollout.block_sizes", (2, 2), "rollout.block_sizes=(2, 2) must be distinct"),
        ("diffusion", "algorithm.clip_eps", 1.5, "algorithm.clip_eps=1.5 must be in [0, 1)"),
        (
            "diffusion",
            "algorithm.rldf_kk",
            2,
            "unknown config key algorithm.rldf_kk (for algorithm.name='diffu_grpo'); did you mean "
            "algorithm.rldf_k?",
        ),
        ("diffusion", "sft.mask_eps", 1.0, "sft.mask_eps=1.0 must be in [0, 0.999]"),
    ],
)
def test_diffusion_keys_and_kind_mismatches_are_named(recipe, key, value, expected):
    config = _diffusion_config() if recipe == "diffusion" else get_config()
    assert error_of(with_value(config, key, value)).startswith(expected)


@pytest.mark.parametrize("name", ["diffu_grpo", "rldf", "wd1", "rspo", "daca"])
def test_the_diffusion_recipe_validates_with_every_diffusion_algorithm(name):
    config = validate_config(with_value(_diffusion_config(), "algorithm.name", name))
    assert config.model.kind == "diffusion" and config.algorithm.rldf_k == 2


def test_a_required_placeholder_left_unset_is_named():
    config = importlib.import_module("configs.ppo_mbpp").get_config()
    message = error_of(config)
    assert message == (
        "task.train_path is required by task.name='local'; set --config.task.train_path=..."
    )


@pytest.mark.parametrize(
    "key,expected",
    [
        (
            "train.learing_rate",
            "unknown config key train.learing_rate; did you mean train.learning_rate?",
        ),
        (
            "rollout.temprature",
            "unknown config key rollout.temprature; did you mean rollout.temperature?",
        ),
        ("trian", "unknown config key trian; did you mean train?"),
        (
            "mesh.sampler_device",
            "unknown config key mesh.sampler_device; did you mean mesh.sampler_devices?",
        ),
        (
            "algorithm.clip_epz",
            "unknown config key algorithm.clip_epz (for "
            "algorithm.name='grpo'); did you mean algorithm.clip_eps?",
        ),
        (
            "task.max_digit",
            "unknown config key task.max_digit (for task.name='addition'); "
            "did you mean task.max_digits?",
        ),
    ],
)
def test_a_typod_key_names_the_closest_valid_key(key, expected):
    config = get_config()
    *section, field = key.split(".")
    (config[section[0]] if section else config)[field] = 1
    assert error_of(config) == expected


def test_an_unknown_key_with_no_close_match_lists_the_valid_keys():
    config = get_config()
    config.mesh.pipeline = 2
    assert error_of(config) == (
        "unknown config key mesh.pipeline; valid keys: mesh.data, mesh.expert, mesh.fsdp, "
        "mesh.sampler_devices, mesh.tensor"
    )


def test_rollout_correction_keys_follow_the_chosen_correction():
    config = get_config()
    config.rollout_correction = {"name": "tis", "cap": 1.5, "level": "sequence"}
    validate_config(config)
    config.rollout_correction = {"name": "mis", "cap": 1.5}  # mis has low/high, not cap
    message = error_of(config)
    assert message.startswith("unknown config key rollout_correction.cap (for ")
    config.rollout_correction = {"name": "tiss"}
    assert "rollout_correction.name='tiss' is unknown; did you mean 'tis'?" in error_of(config)


def test_algorithm_keys_follow_the_preset_and_its_typed_settings():
    config = get_config()
    # rloo takes ppo: PPOSettings, whose fields (PPO's clip and KL keys) are its keys.
    config.algorithm = {"name": "rloo", "clip_eps": 0.1, "kl_coef": 0.01}
    validate_config(config)
    # mu_grpo takes regularizers: Regularizers: aggregation, kl_coef, ...
    config.algorithm = {"name": "mu_grpo", "aggregation": "seq-mean-token-mean", "eps_low": 0.1}
    validate_config(config)
    # gspo takes no settings dataclass and no clip_eps.
    config.algorithm = {"name": "gspo", "clip_eps": 0.2}
    assert "unknown config key algorithm.clip_eps (for algorithm.name='gspo')" in error_of(config)
    # dr_grpo sets grpo's aggregation itself: it is not a key.
    config.algorithm = {"name": "dr_grpo", "max_len": 5, "aggregation": "token-mean"}
    assert "algorithm.aggregation (for algorithm.name='dr_grpo')" in error_of(config)
    config.algorithm = {"name": "dr_grpo"}
    assert error_of(config) == (
        "algorithm.max_len is required by algorithm.name='dr_grpo'; "
        "set --config.algorithm.max_len=..."
    )
    config.algorithm = {"name": "grpo", "group_size": 4}
    assert error_of(config) == (
        "algorithm.group_size is set by the driver from rollout.n_samples; remove "
        "algorithm.group_size"
    )
    config.algorithm = {"name": "grp0"}
    assert "algorithm.name='grp0' is unknown; did you mean 'grpo'?" in error_of(config)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_preset_has_a_known_set_of_keys(name):
    config = get_config()
    config.algorithm = {"name": name}
    try:
        validate_config(config)
    except ValueError as err:  # only a required setting the bare name leaves out
        assert f"is required by algorithm.name={name!r}" in str(err)


@pytest.mark.parametrize(
    "key,value,expected",
    [
        ("train.steps", "10", "train.steps='10' must be an int"),
        ("train.steps", 10.5, "train.steps=10.5 must be an int"),
        ("train.steps", True, "train.steps=True must be an int"),
        ("train.learning_rate", "1e-3", "train.learning_rate='1e-3' must be a float"),
        ("task.chat_template", 1, "task.chat_template=1 must be a bool (True or False)"),
        ("seed", 0.5, "seed=0.5 must be an int"),
        ("model.dtype", 32, "model.dtype=32 must be a str"),
        # From the preset's / task's annotations:
        ("algorithm.normalize_std", "yes", "algorithm.normalize_std='yes' must be a bool"),
        ("algorithm.clip_eps_high", "0.3", "algorithm.clip_eps_high='0.3' must be a float"),
        ("task.max_digits", 2.5, "task.max_digits=2.5 must be an int"),
        ("train", 3, "train=3 must be a section (a ConfigDict of settings)"),
    ],
)
def test_a_value_of_the_wrong_type_is_named(key, value, expected):
    assert error_of(with_value(get_config(), key, value)).startswith(expected)


def test_an_int_is_a_fine_float_and_none_is_an_optional_setting():
    config = with_value(get_config(), "train.learning_rate", 1)
    config.algorithm.clip_eps_high = None
    validate_config(config)


@pytest.mark.parametrize(
    "key,value,expected",
    [
        ("task.max_prompt_len", 0, "task.max_prompt_len=0 must be >= 1"),
        ("rollout.max_new_tokens", 0, "rollout.max_new_tokens=0 must be >= 1"),
        ("rollout.temperature", 0.0, "rollout.temperature=0.0 must be > 0"),
        ("rollout.top_p", 0.0, "rollout.top_p=0.0 must be in (0, 1]"),
        ("rollout.top_p", 1.5, "rollout.top_p=1.5 must be in (0, 1]"),
        ("rollout.top_k", -1, "rollout.top_k=-1 must be >= 0"),
        ("rollout.n_samples", 1, "rollout.n_samples=1: group-relative advantages need"),
        ("train.learning_rate", 0.0, "train.learning_rate=0.0 must be > 0"),
        ("train.epochs", 0, "train.epochs=0 must be >= 1"),
        ("train.pack_ratio", 1.5, "train.pack_ratio=1.5 must be in [0, 1]"),
        ("sft.batch_size", 0, "sft.batch_size=0 must be >= 1"),
        (
            "model.n_heads",
            6,
            "model settings: model.d_model=128 is not divisible by model.n_heads=6",
        ),
        (
            "model.n_heads",
            3,
            "model settings: model.n_heads=3 is not a multiple of model.n_kv_heads=2",
        ),
        ("model.dtype", "fp32", "model settings: model.dtype='fp32'"),
        ("model.remat", "full", "model.remat='full' is unknown"),
    ],
)
def test_an_impossible_value_is_named(key, value, expected):
    assert error_of(with_value(get_config(), key, value)).startswith(expected)


@pytest.mark.parametrize("run_dir", ["", "  "])
def test_an_empty_run_dir_is_refused(run_dir):  # it would write into the current directory
    message = error_of(with_value(get_config(), "run_dir", run_dir))
    assert message.startswith(f"run_dir={run_dir!r} is empty; set --config.run_dir")


@pytest.mark.parametrize(
    "key,value",
    [
        ("train.learning_rate", float("inf")),  # passed: the first update made NaN parameters
        ("train.learning_rate", 1e39),  # finite in Python, inf in float32 on the device
        ("train.weight_decay", float("inf")),
        ("train.max_grad_norm", float("inf")),
        ("algorithm.kl_coef", float("nan")),  # the open sections' settings too
        ("algorithm.clip_eps", float("inf")),
        ("algorithm.entropy_coef", float("-inf")),
    ],
)
def test_a_non_finite_float_is_named(key, value):
    assert error_of(with_value(get_config(), key, value)) == (
        f"{key}={value} must be a finite number within float32's range (|x| <= 3.4e38; the "
        "training dtype)"
    )


def test_a_group_size_that_does_not_split_into_minibatches_is_named(monkeypatch):
    monkeypatch.setattr(jax, "device_count", lambda: 1)  # tests/conftest.py fakes 8
    config = get_config()
    config.train.update(prompts_per_step=5, minibatches=2, microbatches=1)
    config.rollout.n_samples = 3
    assert error_of(config).startswith(
        "train.prompts_per_step x rollout.n_samples = 5 x 3 = 15 rows is not divisible by "
        "train.minibatches x train.microbatches = 2 x 1"
    )
    config.rollout.n_samples = 4  # 20 rows = 2 x 10
    validate_config(config)
    config.train.microbatches = 4  # 20 rows / (2 x 4)
    assert "2 x 4" in error_of(config)


def test_replay_groups_must_split_like_the_fresh_batch():
    config = get_config()
    config.train.minibatches = 16  # 64 x 8 = 512 fresh rows split; 3 x 8 = 24 replay rows not
    config.replay.update(name="fresh_per", groups=3)
    assert error_of(config).startswith("replay.groups=3 groups x rollout.n_samples=8 must split")


@pytest.mark.parametrize(
    "devices,mesh,train,expected",
    [
        (
            8,
            {"data": 3},
            {},
            "mesh.data=3 x mesh.fsdp=1 x mesh.tensor=1 x mesh.expert=1 = 3 "
            "devices, but the trainer has jax.device_count()=8; set sizes whose product is 8",
        ),
        (
            8,
            {"tensor": 3},
            {},
            "mesh.data=-1 x mesh.fsdp=1 x mesh.tensor=3 x mesh.expert=1: "
            "the other sizes' product 3 does not divide the jax.device_count()=8 devices",
        ),
        (
            8,
            {"fsdp": -1},
            {},
            "mesh.data=-1 x mesh.fsdp=-1 x mesh.tensor=1 x mesh.expert=1: "
            "at most one mesh size may be -1",
        ),
        (8, {"data": 0}, {}, "mesh.data=0 x mesh.fsdp=1"),
        (
            8,
            {},
            {"prompts_per_step": 12},
            "train.prompts_per_step=12 is not divisible by mesh.data x mesh.fsdp = 8 x 1",
        ),
        (
            8,
            {"sampler_devices": 8},
            {},
            "mesh.sampler_devices=8 must leave the trainer at least one of the 8 devices",
        ),
        (
            8,
            {"sampler_devices": 3},
            {},
            "train.prompts_per_step=64 is not divisible by mesh.data x mesh.fsdp = 5 x 1",
        ),
        (
            4,
            {"sampler_devices": 3},
            {},
            "train.prompts_per_step=64 is not divisible by mesh.sampler_devices=3",
        ),
        (
            2,
            {"data": 2, "fsdp": 2},
            {},
            "mesh.data=2 x mesh.fsdp=2 x mesh.tensor=1 x mesh.expert=1 = 4 devices, but the "
            "trainer has jax.device_count()=2; set sizes whose product is 2",
        ),
    ],
)
def test_a_mesh_that_does_not_fit_the_devices_is_named(monkeypatch, devices, mesh, train, expected):
    monkeypatch.setattr(jax, "device_count", lambda: devices)
    config = get_config()
    config.mesh.update(mesh)
    config.train.update(train)
    assert error_of(config).startswith(expected)


def test_the_mesh_fits_when_its_product_is_the_device_count(monkeypatch):
    monkeypatch.setattr(jax, "device_count", lambda: 8)
    config = get_config()
    config.mesh.update(data=2, fsdp=2, tensor=2)
    validate_config(config)
    config.mesh.update(sampler_devices=4, data=-1, fsdp=1, tensor=1)  # 4 + 4
    validate_config(config)
    config.sft.batch_size = 6  # split over the trainer's 4 data replicas
    assert error_of(config).startswith("sft.batch_size=6 is not divisible by mesh.data")


def test_prompt_plus_completion_over_a_checkpoints_length_is_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 12}))
    config = get_config()
    config.model.checkpoint = str(tmp_path)
    config.task.max_prompt_len = 7  # 7 + 5 = 12 tokens fit exactly
    validate_config(config)
    config.task.max_prompt_len = 8
    assert error_of(config) == (
        "task.max_prompt_len + rollout.max_new_tokens = 8 + 5 = 13 tokens exceed the "
        "checkpoint's max_position_embeddings=12; lower one of them"
    )
    config.model.checkpoint = str(tmp_path / "missing")
    assert error_of(config).startswith(f"model.checkpoint='{tmp_path / 'missing'}' is neither")


def test_validation_compiles_nothing():
    # A bad config deep into the checks (the model's length budget) and a good one with every
    # optional feature's builder exercised: no XLA compilation either way.
    bad = with_value(get_config(), "model.n_heads", 3)
    good = get_config()
    good.replay.update(name="fresh_per", groups=8)
    good.prompt_selection.update(name="dare", pool_size=128)
    good.rollout_correction = {"name": "tis", "cap": 1.5}
    good.rollout.update(weight_format="mxfp4", aqn_sigma_start=0.01)
    COMPILES["events"].clear()
    COMPILES["on"] = True
    try:
        with pytest.raises(ValueError, match="n_heads=3"):
            validate_config(bad)
        validate_config(good)
        seen_by_validation = len(COMPILES["events"])
        jax.jit(lambda x: x * 3 + 1)(np.arange(5.0))  # the detector does see a compile
        seen_with_a_jit = len(COMPILES["events"])
    finally:
        COMPILES["on"] = False
    assert seen_by_validation == 0
    assert seen_with_a_jit > 0
