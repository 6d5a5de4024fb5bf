"""The driver's reward components as the [B, K] rewards that multi-reward advantages read.

A task that scores K things (correctness, partial credit, format, ...) gives the driver its
`reward_components`, which the collector sends as `extras["reward_components"]` [B, K] beside
the task's one reward [B] (which accuracy, the logs and DAPO's refill keep using). GDPO and
GPRL normalise each dimension of [B, K] `batch.rewards`; this transform, first in their chain,
puts the components there.
"""

import chex

from rljax.core import keys
from rljax.core.batch import Batch
from rljax.core.transform import Context, Metrics, Transform, stateless

REWARD_COMPONENTS = "reward_components"


def components_as_rewards() -> Transform:
    """Transform writing `batch.rewards = batch.extras["reward_components"]` ([B, K]).

    Returns:
      A stateless `Transform` with no metrics (the collector logs each component's mean).

    Raises:
      ValueError (chex): at apply, for components that are not [B, K].
    """

    def fn(batch: Batch, ctx: Context) -> tuple[Batch, Metrics]:
        del ctx
        components = batch.extras[REWARD_COMPONENTS]
        chex.assert_rank(components, 2)
        chex.assert_equal(components.shape[0], batch.rewards.shape[0])
        return batch.replace(rewards=components), {}

    return stateless(fn, {keys.REWARD_COMPONENTS}, {keys.REWARDS})
