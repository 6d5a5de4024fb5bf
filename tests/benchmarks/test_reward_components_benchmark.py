"""benchmarks.reward_components: its summed-components baseline and its configs."""

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.reward_components import WEIGHTS, config_for, grpo_summed
from rljax.config import validate_config
from rljax.core.batch import make_batch
from rljax.core.transform import Context


def test_the_baseline_normalises_the_weighted_sum_of_the_components():
    components = np.array([[1, 1, 1], [0, 0.5, 1], [0, 0, 0], [1, 1, 1]], np.float32)
    batch = make_batch(
        prompt_tokens=np.zeros((4, 1)),
        prompt_mask=np.ones((4, 1)),
        completion_tokens=np.zeros((4, 2)),
        completion_mask=np.ones((4, 2), bool),
        group_id=np.arange(4) // 2,
        rewards=components[:, 0],
        extras={"reward_components": components},
    )
    t = grpo_summed(2).transform
    out, _, _ = t.apply(batch, t.init(), Context(step=jnp.int32(0), rng=jax.random.PRNGKey(0)))
    total = (components @ np.asarray(WEIGHTS)).reshape(2, 2)
    # GRPO: (r - group mean) / (unbiased group std + 1e-6); group 1 is constant.
    std = total.std(axis=1, ddof=1, keepdims=True)
    expected = ((total - total.mean(axis=1, keepdims=True)) / (std + 1e-6)).reshape(-1)
    np.testing.assert_allclose(out.advantages[:, 0], expected, rtol=1e-5, atol=1e-6)


def test_the_three_methods_share_every_setting_but_the_algorithm():
    configs = {m: config_for(m, 1) for m in ("grpo", "gdpo")}
    for config in configs.values():
        validate_config(config)
        assert config.seed == 1 and config.sft.steps == 200 and config.train.steps == 150
    a, b = (c.to_dict() for c in configs.values())
    a.pop("algorithm"), b.pop("algorithm"), a.pop("run_dir"), b.pop("run_dir")
    assert a == b
