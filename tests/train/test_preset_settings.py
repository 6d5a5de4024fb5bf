"""The preset-settings rule (rljax.train.builders.preset_settings): a preset parameter annotated
with a dataclass gives that dataclass's fields as flat algorithm.* config keys, for built-in and
registered presets alike; validation checks them and build_algorithm builds the instance."""

import dataclasses
import inspect

import pytest

import rljax.algorithms
from configs.grpo_addition import get_config
from rljax.advantages.group import group_advantages
from rljax.algorithms import Algorithm, PPOSettings, Regularizers, grpo, uec_rl
from rljax.algorithms.base import ppo_preset
from rljax.config import validate_config
from rljax.config.validate import _callable_parameters
from rljax.train.builders import (
    ALGORITHMS,
    build_algorithm,
    preset_arguments,
    preset_settings,
    register_algorithm,
)

NAME = "test_shaped"


@dataclasses.dataclass(frozen=True)
class Shaping:
    """A toy settings dataclass."""

    scale: float = 1.0
    offset: float = 0.0
    mode: str = "centred"


CALLS = []  # what the toy presets were called with


def shaped(
    group_size: int,
    label: str = "plain",
    shaping: Shaping = Shaping(scale=2.0),
    ppo: PPOSettings = PPOSettings(clip_eps=0.1),
) -> Algorithm:
    """A user preset with a plain parameter and two dataclass parameters."""
    CALLS.append({"label": label, "shaping": shaping, "ppo": ppo})
    return ppo_preset(group_advantages(group_size), ppo)


@pytest.fixture
def registered():
    CALLS.clear()
    register_algorithm(NAME, shaped)
    yield NAME
    ALGORITHMS.pop(NAME, None)


def config_for(**algorithm):
    config = get_config()
    config.algorithm = {"name": NAME, **algorithm}
    return config


def error_of(config) -> str:
    with pytest.raises(ValueError) as info:
        validate_config(config)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_dataclass_fields_are_flat_keys():
    settings = preset_settings(shaped)
    ppo_fields = [f.name for f in dataclasses.fields(PPOSettings)]
    assert list(settings) == ["group_size", "label", "scale", "offset", "mode", *ppo_fields]
    assert settings["scale"] == (float, 2.0, "shaping")  # the default instance's value
    assert settings["clip_eps"] == (float, 0.1, "ppo")
    assert settings["kl_coef"] == (float, 0.0, "ppo")
    assert settings["label"] == (str, "plain", None)
    assert "shaping" not in settings and "ppo" not in settings


def test_built_values_equal_the_configs(registered):
    config = config_for(scale=3.0, mode="raw", clip_eps=0.3, kl_coef=0.05, label="x")
    build_algorithm(validate_config(config))
    # Fields the config leaves out keep the preset's default instance's values.
    assert CALLS[-1] == {
        "label": "x",
        "shaping": Shaping(scale=3.0, offset=0.0, mode="raw"),
        "ppo": PPOSettings(clip_eps=0.3, kl_coef=0.05),
    }
    build_algorithm(validate_config(config_for()))
    assert CALLS[-1] == {
        "label": "plain",
        "shaping": Shaping(scale=2.0),
        "ppo": PPOSettings(clip_eps=0.1),
    }


def test_built_in_presets_build_their_settings_from_the_keys():
    config = get_config()
    config.algorithm = {"name": "grpo", "clip_eps": 0.3, "aggregation": "seq-mean-token-mean"}
    kwargs = preset_arguments(grpo, {k: v for k, v in config.algorithm.items() if k != "name"})
    assert kwargs == {"ppo": PPOSettings(clip_eps=0.3, aggregation="seq-mean-token-mean")}
    # uec_rl's own default instance: its KL loss stays on when only the clip is set.
    kwargs = preset_arguments(uec_rl, {"clip_eps": 0.3, "replay_every": 2})
    assert kwargs == {
        "ppo": PPOSettings(clip_eps=0.3, kl_coef=0.01, kl_estimator="low_var_kl"),
        "replay_every": 2,
    }
    config.algorithm = {"name": "grpo", "clip_eps": 0.3, "kl_coef": 0.1}
    algorithm = build_algorithm(validate_config(config))
    assert algorithm.needs_reference  # the KL term from the config's kl_coef


def test_an_unknown_field_gets_did_you_mean(registered):
    assert error_of(config_for(scal=3.0)) == (
        f"unknown config key algorithm.scal (for algorithm.name={NAME!r}); "
        "did you mean algorithm.scale?"
    )
    assert error_of(config_for(clip_esp=0.3)).endswith("did you mean algorithm.clip_eps?")
    # The dataclass parameter's own name is not a key: its fields are.
    assert error_of(config_for(shaping=Shaping())).startswith(
        "unknown config key algorithm.shaping"
    )
    config = get_config()
    config.algorithm = {"name": "rloo", "kl_coeff": 0.1}
    assert error_of(config) == (
        "unknown config key algorithm.kl_coeff (for algorithm.name='rloo'); "
        "did you mean algorithm.kl_coef?"
    )


@pytest.mark.parametrize(
    "key,value,expected",
    [
        ("scale", "big", "algorithm.scale='big' must be a float"),
        ("mode", 3, "algorithm.mode=3 must be a str"),
        ("kl_coef", "0.1", "algorithm.kl_coef='0.1' must be a float"),
        ("max_len", 2.5, "algorithm.max_len=2.5 must be an int"),
        ("label", True, "algorithm.label=True must be a str"),
    ],
)
def test_a_wrongly_typed_field_is_named(registered, key, value, expected):
    assert error_of(config_for(**{key: value})) == expected


def test_a_field_check_fails_at_build_time_naming_the_field(registered):
    config = validate_config(config_for(clip_eps=1.5))
    with pytest.raises(ValueError, match=r"clip_eps=1.5 must be in \[0, 1\)"):
        build_algorithm(config)


@dataclasses.dataclass(frozen=True)
class Budget:
    """A dataclass with a required field."""

    tokens: int
    share: float = 0.5


def budgeted(group_size: int, budget: Budget) -> Algorithm:
    CALLS.append({"budget": budget})
    return ppo_preset(group_advantages(group_size))


def test_a_dataclass_parameter_without_default_takes_the_fields_defaults():
    CALLS.clear()
    register_algorithm("test_budgeted", budgeted)
    try:
        config = get_config()
        config.algorithm = {"name": "test_budgeted"}
        assert error_of(config) == (
            "algorithm.tokens is required by algorithm.name='test_budgeted'; "
            "set --config.algorithm.tokens=..."
        )
        config.algorithm = {"name": "test_budgeted", "tokens": 16}
        build_algorithm(validate_config(config))
        assert CALLS[-1] == {"budget": Budget(tokens=16, share=0.5)}
    finally:
        ALGORITHMS.pop("test_budgeted", None)


def test_a_dataclass_parameter_is_passed_only_when_needed():
    # With a default instance and no field set: the preset's own default applies.
    assert preset_arguments(shaped, {"label": "x"}) == {"label": "x"}

    def knobbed(group_size: int, shaping: Shaping) -> Algorithm:
        return ppo_preset(group_advantages(group_size))

    # Without a default, it is built even when no field is set (all fields have defaults).
    assert preset_arguments(knobbed, {}) == {"shaping": Shaping()}
    assert preset_arguments(knobbed, {"offset": 2.0}) == {"shaping": Shaping(offset=2.0)}


def test_an_unannotated_parameter_with_a_dataclass_default_counts_too():
    def preset(group_size, shaping=Shaping(offset=1.0)):
        return None

    settings = preset_settings(preset)
    assert list(settings) == ["group_size", "scale", "offset", "mode"]
    assert settings["offset"] == (float, 1.0, "shaping")


def clash_plain(group_size: int, max_len: int = 8, ppo: PPOSettings = PPOSettings()) -> Algorithm:
    return ppo_preset(group_advantages(group_size), ppo)


def clash_fields(
    group_size: int, ppo: PPOSettings = PPOSettings(), extra: Regularizers = Regularizers()
) -> Algorithm:
    return ppo_preset(group_advantages(group_size), ppo)


@pytest.mark.parametrize(
    "preset,expected",
    [
        (
            clash_plain,
            "preset clash_plain takes max_len twice, as a parameter and as a field of ppo: "
            "PPOSettings, so algorithm.max_len would be ambiguous; rename one of them",
        ),
        (
            clash_fields,
            "preset clash_fields takes aggregation twice, as a field of ppo: PPOSettings and "
            "as a field of extra: Regularizers, so algorithm.aggregation would be ambiguous; "
            "rename one of them",
        ),
    ],
)
def test_a_key_taken_twice_is_refused_at_register_time(preset, expected):
    with pytest.raises(ValueError) as info:
        register_algorithm("test_clash", preset)
    assert str(info.value) == expected
    assert "test_clash" not in ALGORITHMS


# The algorithm.* keys of every built-in preset as rljax.config.validate._callable_parameters
# gave them before the presets took typed settings (`**ppo_settings` / `**regularizers`
# followed through validate's _FORWARDED tables): {key: (repr of the default, or "REQUIRED";
# the accepted types)}. Dumped from commit 8b1ccce.
PPO_KEYS = {
    "clip_eps": ("0.2", "float"),
    "clip_eps_high": ("None", "NoneType|float"),
    "kl_coef": ("0.0", "float"),
    "kl_estimator": ("'k3'", "str"),
    "entropy_coef": ("0.0", "float"),
    "aggregation": ("'token-mean'", "str"),
    "max_len": ("None", "NoneType|int"),
}
REGULARIZER_KEYS = {
    "aggregation": ("'token-mean'", "str"),
    "max_len": ("None", "NoneType|int"),
    "kl_coef": ("0.0", "float"),
    "kl_estimator": ("'k3'", "str"),
    "entropy_coef": ("0.0", "float"),
}
LOW_VAR_KL = {"kl_estimator": ("'low_var_kl'", "str")}
OLD_KEYS = {
    "cispo": {
        **REGULARIZER_KEYS,
        **LOW_VAR_KL,
        "eps_high": ("0.2", "float"),
        "eps_low": ("None", "NoneType|float"),
    },
    "clip_cov": {
        **REGULARIZER_KEYS,
        "clip_eps": ("0.2", "float"),
        "clip_eps_high": ("None", "NoneType|float"),
        "clip_ratio": ("0.0002", "float"),
        "cov_lower": ("1.0", "float"),
        "cov_upper": ("5.0", "float"),
    },
    "dapo": {
        "cache_len": ("REQUIRED", "int"),
        "clip_eps_high": ("0.28", "float"),
        "clip_eps_low": ("0.2", "float"),
        "entropy_coef": ("0.0", "float"),
        "eos_id": ("None", "NoneType|int"),
        "max_len": ("None", "NoneType|int"),
        "penalty_factor": ("1.0", "float"),
    },
    "dgpo": {
        "aggregation": ("'token-mean'", "str"),
        "clip_eps": ("0.2", "float"),
        "clip_eps_high": ("None", "NoneType|float"),
        "entropy_coef": ("0.0", "float"),
        "max_len": ("None", "NoneType|int"),
        "temperature": ("1.0", "float"),
        "vocab_size": ("REQUIRED", "int"),
    },
    "dr_grpo": {
        "clip_eps": ("0.2", "float"),
        "clip_eps_high": ("None", "NoneType|float"),
        "entropy_coef": ("0.0", "float"),
        "kl_coef": ("0.0", "float"),
        "kl_estimator": ("'k3'", "str"),
        "max_len": ("REQUIRED", "int"),
    },
    "dr_mas": {**PPO_KEYS, "agent_key": ("'agent_id'", "str")},
    "edo": {**PPO_KEYS, "coef": ("0.1", "float"), "only_correct": ("False", "bool")},
    "entrocraft": {
        **PPO_KEYS,
        "lower": ("(0.6, 0.4)", "tuple"),
        "outside": ("'estimator'", "str"),
        "schedule": ("'linear'", "str"),
        "selection": ("'sign'", "str"),
        "signed_reward_threshold": ("None", "NoneType|float"),
        "total_steps": ("REQUIRED", "int"),
        "upper": ("(0.7, 0.5)", "tuple"),
    },
    "entropic": {
        **PPO_KEYS,
        "base": ("'grpo'", "str"),
        "integral_gain": ("0.01", "float"),
        "proportional_gain": ("1.0", "float"),
        "target_entropy": ("REQUIRED", "float"),
    },
    "expthink": {
        **PPO_KEYS,
        "capacity": ("1048576", "int"),
        "correct_threshold": ("1.0", "float"),
        "discount": ("0.5", "float"),
    },
    "gpg": {**REGULARIZER_KEYS, **LOW_VAR_KL, "valid_group_scaling": ("True", "bool")},
    "gprl": {
        **PPO_KEYS,
        "drift_threshold": ("0.6", "float"),
        "drift_window": ("8", "int"),
        "num_dimensions": ("REQUIRED", "int"),
        "reward_components": ("False", "bool"),
        "weights": ("None", "NoneType|tuple"),
    },
    "grpo": {**PPO_KEYS, "normalize_std": ("True", "bool"), "std_scope": ("'group'", "str")},
    "gspo": {
        "entropy_coef": ("0.0", "float"),
        "eps_high": ("0.0004", "float"),
        "eps_low": ("0.0003", "float"),
        "kl_coef": ("0.0", "float"),
        "kl_estimator": ("'low_var_kl'", "str"),
        "token_level": ("False", "bool"),
    },
    "ibpo": {**PPO_KEYS},
    "kernel_baseline": {**PPO_KEYS, "bandwidth": ("1.0", "float")},
    "kl_cov": {**REGULARIZER_KEYS, "k_ratio": ("0.002", "float"), "kl_cov_coef": ("1.0", "float")},
    "lead": {
        **PPO_KEYS,
        "alpha": ("1.0", "float"),
        "beta": ("0.95", "float"),
        "correct_threshold": ("1.0", "float"),
        "l_max": ("8000.0", "float"),
        "l_min": ("1000.0", "float"),
        "mode": ("'max_sym'", "str"),
        "w_min": ("0.3", "float"),
    },
    "mu_grpo": {
        **REGULARIZER_KEYS,
        "eps_high": ("0.28", "float"),
        "eps_low": ("0.2", "float"),
        "veto_delta": ("None", "NoneType|float"),
    },
    "opo": {**PPO_KEYS},
    "otb": {
        **PPO_KEYS,
        "align": ("'position'", "str"),
        "handle_zero_tail": ("False", "bool"),
        "use_is_weight": ("False", "bool"),
    },
    "pass_at_k": {**PPO_KEYS, "k": ("REQUIRED", "int")},
    "power_distillation": {
        "alpha": ("4.0", "float"),
        "length_normalize": ("False", "bool"),
        "proposal": ("'old'", "str"),
        "teacher": ("'old'", "str"),
    },
    "ppo": {
        "aggregation": ("'token-mean'", "str"),
        "clip_eps": ("0.2", "float"),
        "clip_eps_high": ("None", "NoneType|float"),
        "dual_clip_c": ("None", "NoneType|float"),
        "entropy_coef": ("0.0", "float"),
        "gamma": ("1.0", "float"),
        "kl_coef": ("0.0", "float"),
        "kl_estimator": ("'k1'", "str"),
        "lam": ("0.95", "float"),
        "max_len": ("None", "NoneType|int"),
        "value_clip": ("0.2", "NoneType|float"),
        "value_coef": ("0.5", "float"),
    },
    "reinforce_pp": {**PPO_KEYS},
    "remax": {**PPO_KEYS},
    "rloo": {**PPO_KEYS},
    "segment_po": {
        **REGULARIZER_KEYS,
        "delimiter_ids": ("(10,)", "tuple"),
        "eps_high": ("0.2", "float"),
        "eps_low": ("0.2", "float"),
        "process_advantages": ("False", "bool"),
    },
    # Added since that commit: the multi-turn presets.
    "turn_grpo": {**PPO_KEYS, "gamma": ("1.0", "float"), "normalize_std": ("True", "bool")},
    "turn_ppo": {
        "aggregation": ("'token-mean'", "str"),
        "clip_eps": ("0.2", "float"),
        "clip_eps_high": ("None", "NoneType|float"),
        "entropy_coef": ("0.0", "float"),
        "gamma": ("1.0", "float"),
        "lam": ("0.95", "float"),
        "max_len": ("None", "NoneType|int"),
        "value_clip": ("0.2", "NoneType|float"),
        "value_coef": ("0.5", "float"),
    },
    "uec_rl": {
        **PPO_KEYS,
        **LOW_VAR_KL,
        "kl_coef": ("0.01", "float"),
        "drop_truncated_positive": ("True", "bool"),
        "explore_keep_threshold": ("1.0", "float"),
        "explore_samples": ("20", "int"),
        "explore_temperature": ("1.2", "float"),
        "hard_reward_threshold": ("0.01", "float"),
        "keep_threshold": ("0.05", "float"),
        "replay_capacity": ("2.0", "float"),
        "replay_every": ("5", "int"),
        "replay_threshold": ("1.0", "float"),
    },
    # Added since: issue 26's GDPO, MaxRL, adaptive-entropy and trust-region presets.
    "adaptive_entropy": {
        **PPO_KEYS,
        "coef_step": ("0.005", "float"),
        "max_coef": ("0.05", "float"),
        "target_entropy": ("0.2", "float"),
    },
    "maxrl": PPO_KEYS,
    "on_policy_distillation": {
        **PPO_KEYS,
        "center": ("False", "bool"),
        "task_coef": ("0.0", "float"),
        "teacher_coef": ("1.0", "float"),
    },
    "gkd": {
        **PPO_KEYS,
        "beta": ("0.5", "float"),
        "jsd_coef": ("1.0", "float"),
        "task_rewards": ("False", "bool"),
    },
    "gdpo": {
        **PPO_KEYS,
        "normalize_std": ("True", "bool"),
        "reward_components": ("False", "bool"),
        "weights": ("None", "NoneType|tuple"),
    },
    "sapo": {
        **REGULARIZER_KEYS,
        "aggregation": ("'seq-mean-token-mean'", "str"),
        "tau_neg": ("1.05", "float"),
        "tau_pos": ("1.0", "float"),
    },
    "gmpo": {
        **REGULARIZER_KEYS,
        "aggregation": ("'seq-mean-token-mean'", "str"),
        "eps_high": ("0.4", "float"),
        "eps_low": ("0.4", "float"),
    },
    "ipo": {**REGULARIZER_KEYS, "kl_tau": ("0.001", "float"), "threshold": ("0.1", "float")},
    "dppo": {
        **REGULARIZER_KEYS,
        "delta_high": ("0.2", "float"),
        "delta_low": ("0.2", "float"),
        "divergence": ("'tv'", "str"),
        "ratio_cap": ("20.0", "float"),
    },
}


def test_the_built_in_presets_are_the_same_set():
    built_in = {
        name
        for name in rljax.algorithms.__all__
        if not isinstance(getattr(rljax.algorithms, name), type)
    }
    assert built_in == set(OLD_KEYS)
    assert built_in <= set(ALGORITHMS)


@pytest.mark.parametrize("name", sorted(OLD_KEYS))
def test_every_built_in_preset_accepts_the_keys_it_accepted_before(name):
    now = {
        key: (
            "REQUIRED" if s.default is inspect.Parameter.empty else repr(s.default),
            None if s.kinds is None else "|".join(sorted(k.__name__ for k in s.kinds)),
        )
        for key, s in _callable_parameters("algorithm", name).items()
    }
    assert now == OLD_KEYS[name]
