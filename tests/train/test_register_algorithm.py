"""register_algorithm: a user preset trains through the normal config path without editing rljax."""

import functools

import numpy as np
import pytest

import rljax.train
from configs.grpo_addition import get_config
from rljax.algorithms import Algorithm
from rljax.config import validate_config
from rljax.core.batch import make_batch
from rljax.core.transform import Context, stateless
from rljax.objectives.surrogate import ppo_clip
from rljax.train.builders import ALGORITHMS, build_algorithm, register_algorithm

NAME = "test_scaled_centred"


def scaled_centred(group_size: int, scale: float = 1.0, clip_eps: float = 0.2) -> Algorithm:
    """Advantages scale * (r - group mean) with the PPO clip loss: a toy preset."""

    def fn(batch, ctx):
        r = batch.rewards.reshape(-1, group_size)
        adv = (scale * (r - r.mean(axis=1, keepdims=True))).reshape(-1)
        return batch.replace(advantages=adv[:, None] * batch.completion_mask), {}

    return Algorithm(stateless(fn), ppo_clip(clip_eps, clip_eps))


@pytest.fixture
def registered():
    register_algorithm(NAME, scaled_centred)
    yield NAME
    ALGORITHMS.pop(NAME, None)


def config_for(**algorithm):
    config = get_config()
    config.algorithm = {"name": NAME, **algorithm}
    return config


def test_registered_preset_is_listed_and_exported(registered):
    assert ALGORITHMS[registered] is scaled_centred
    assert rljax.train.register_algorithm is register_algorithm


def test_validation_accepts_the_preset_keys_and_still_catches_typos(registered):
    validate_config(config_for(scale=0.5, clip_eps=0.1))
    with pytest.raises(ValueError, match=r"algorithm\.scal\b.*did you mean algorithm\.scale"):
        validate_config(config_for(scal=0.5))
    with pytest.raises(ValueError, match=r"algorithm\.scale='big' must be a float"):
        validate_config(config_for(scale="big"))
    with pytest.raises(ValueError, match="set by the driver from rollout.n_samples"):
        validate_config(config_for(group_size=4))


def test_build_algorithm_passes_group_size_and_settings(registered):
    config = config_for(scale=0.5)
    config.rollout.n_samples = 4
    algorithm = build_algorithm(config)
    rewards = np.array([1.0, 0.0, 0.0, 1.0, 3.0, 1.0, 1.0, 3.0], np.float32)
    batch = make_batch(
        np.ones((8, 2)), np.ones((8, 2)), np.ones((8, 3)), np.ones((8, 3)),
        np.repeat([0, 1], 4), rewards,
    )  # fmt: skip
    ctx = Context(step=np.int32(0), rng=np.zeros(2, np.uint32))
    out, _, _ = algorithm.transform.apply(batch, algorithm.transform.init(), ctx)
    # Hand-computed: group means 0.5 and 2.0, times scale 0.5.
    expected = np.array([0.25, -0.25, -0.25, 0.25, 0.5, -0.5, -0.5, 0.5])
    np.testing.assert_allclose(np.asarray(out.advantages), np.repeat(expected[:, None], 3, 1))


def test_existing_name_is_refused_unless_replace(registered):
    with pytest.raises(ValueError, match="'grpo' is already registered"):
        register_algorithm("grpo", scaled_centred)
    with pytest.raises(ValueError, match="already registered.*replace=True"):
        register_algorithm(registered, lambda group_size: None)

    def other(group_size: int) -> Algorithm:
        return scaled_centred(group_size)

    register_algorithm(registered, other, replace=True)
    assert ALGORITHMS[registered] is other


def test_bad_presets_are_refused():
    with pytest.raises(TypeError, match="not callable"):
        register_algorithm(NAME, "scaled_centred")
    with pytest.raises(ValueError, match="no group_size parameter"):
        register_algorithm(NAME, lambda n: None)
    with pytest.raises(ValueError, match=r"preset functools\.partial\(.*no group_size"):
        register_algorithm(NAME, functools.partial(scaled_centred, 4))
    with pytest.raises(ValueError, match=r"takes \*\*settings"):
        register_algorithm(NAME, lambda group_size, **settings: None)
    assert NAME not in ALGORITHMS
