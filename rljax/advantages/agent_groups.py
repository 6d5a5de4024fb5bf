"""Dr. MAS: group-relative advantages normalised per (prompt, agent) cell in multi-agent RL."""

import chex
import jax
import jax.numpy as jnp

from rljax.advantages.sequence import sequence_advantages
from rljax.core import keys
from rljax.core.batch import Batch
from rljax.core.transform import Metrics, Transform

AGENT_KEY = "agent_id"


def _check_group_size(group_size: int) -> None:
    if group_size < 2:
        raise ValueError(
            f"group_size={group_size}: per-agent group normalisation needs at least 2 samples "
            "per prompt (a lone sample has no group std); sample G >= 2 completions per prompt"
        )


def _same_cell(group_id: jax.Array, agent_id: jax.Array, group_size: int) -> jax.Array:
    """[B/G, G, G] bool: samples i and j of one contiguous group share prompt and agent."""
    g = group_id.reshape(-1, group_size)
    a = agent_id.reshape(-1, group_size)
    return (g[:, :, None] == g[:, None, :]) & (a[:, :, None] == a[:, None, :])


def agent_normalized_advantages(
    rewards: jax.Array,
    group_id: jax.Array,
    agent_id: jax.Array,
    group_size: int,
    eps: float = 1e-6,
) -> jax.Array:
    """Advantages normalised within each (prompt group, agent) cell.

    Dr. MAS ("Dr. MAS", arXiv 2602.08847; the rule follows the authors' verl code, which
    keys GRPO groups by f"{uid}_{agent_id}"): each reward is compared only with the rewards
    of the same agent on the same prompt,

      A_i = (r_i - mean_cell) / (std_cell + eps),

    the mean and unbiased (ddof=1) std running over the samples j of i's contiguous group of
    G with agent_id_j = agent_id_i (and group_id_j = group_id_i). Agents whose rewards have
    different scales then get comparable gradient magnitudes. A cell with one sample, or
    whose rewards are all equal, gets exactly 0 (verl would give a lone sample r / (1 + eps);
    here it carries no relative signal). Cells are found with [B/G, G, G] pairwise masks, so
    agent ids may be arbitrary ints and the cost is static.

    Args:
      rewards: [B] rewards, one per agent step, laid out as B/G contiguous groups of G.
      group_id: [B] int prompt index of each sample.
      agent_id: [B] int agent index of each sample.
      group_size: G, samples per prompt group (>= 2).
      eps: added to the cell std.

    Returns:
      [B] advantages; they sum to 0 within each cell.

    Raises:
      ValueError: if G < 2 or G does not divide B.
    """
    chex.assert_rank(rewards, 1)
    chex.assert_equal_shape([rewards, group_id, agent_id])
    b = rewards.shape[0]
    _check_group_size(group_size)
    if b % group_size:
        raise ValueError(f"group_size={group_size} does not divide batch {b}")
    same = _same_cell(group_id, agent_id, group_size)  # [B/G, G, G]
    r = rewards.reshape(b // group_size, group_size).astype(jnp.float32)
    w = same.astype(jnp.float32)
    n = w.sum(axis=2)  # [B/G, G]: cell size of sample i, over j
    mean = jnp.einsum("gij,gj->gi", w, r) / n
    dev = r[:, None, :] - mean[:, :, None]  # [B/G, G(i), G(j)]: r_j - mean of i's cell
    var = jnp.sum(w * dev**2, axis=2) / jnp.maximum(n - 1.0, 1.0)
    differs = jnp.any(same & (r[:, None, :] != r[:, :, None]), axis=2)  # some cell reward != r_i
    degenerate = (n < 2) | ~differs
    adv = jnp.where(degenerate, 0.0, (r - mean) / (jnp.sqrt(var) + eps))
    return adv.reshape(b)


def agent_advantages(group_size: int, agent_key: str = AGENT_KEY, eps: float = 1e-6) -> Transform:
    """Transform writing Dr. MAS per-agent advantages to `batch.advantages`.

    `batch.advantages = agent_normalized_advantages(r, group_id, agent_id)[:, None] *
    completion_mask` ("Dr. MAS", arXiv 2602.08847). The driver puts each sample's agent index
    in `batch.extras[agent_key]` ([B] int32), e.g. 0 for the solver and 1 for the verifier.

    Args:
      group_size: G, samples per prompt group (>= 2).
      agent_key: the `batch.extras` key holding the [B] agent ids.
      eps: added to the cell std.

    Returns:
      A stateless `Transform`. Metrics: "drmas/advantages/{mean,std,min,max}" over valid
      (completion_mask) tokens, "drmas/zero_adv_frac" (fraction of samples in a singleton or
      all-equal cell, whose advantage is 0) and "drmas/mean_cell_size" (mean over samples of
      their cell's size).

    Raises:
      ValueError: at construction if G < 2; at apply if rewards are not [B],
        `batch.extras[agent_key]` is missing, not [B] or not integer, or `batch.group_id` is
        not contiguous groups of G (see `check_groups`).
    """
    _check_group_size(group_size)

    def fn(rewards: jax.Array, batch: Batch) -> tuple[jax.Array, Metrics]:
        if agent_key not in batch.extras:
            raise ValueError(
                f"agent_advantages needs batch.extras[{agent_key!r}]: the [B] int agent index "
                "of each sample (which agent produced that step); have the multi-agent rollout "
                f"put it there (extras has keys {sorted(batch.extras)})"
            )
        agent_id = jnp.asarray(batch.extras[agent_key])
        if agent_id.shape != rewards.shape:
            raise ValueError(
                f"batch.extras[{agent_key!r}] has shape {agent_id.shape}, expected [B] = "
                f"{rewards.shape}: one agent id per sample"
            )
        if not jnp.issubdtype(agent_id.dtype, jnp.integer):
            raise ValueError(
                f"batch.extras[{agent_key!r}] has dtype {agent_id.dtype}, expected an integer "
                "dtype (agent indices)"
            )
        adv = agent_normalized_advantages(rewards, batch.group_id, agent_id, group_size, eps)
        same = _same_cell(batch.group_id, agent_id, group_size)
        n = same.sum(axis=2).astype(jnp.float32)
        r = rewards.reshape(-1, group_size)
        differs = jnp.any(same & (r[:, None, :] != r[:, :, None]), axis=2)
        return adv, {
            "drmas/zero_adv_frac": jnp.mean(((n < 2) | ~differs).astype(jnp.float32)),
            "drmas/mean_cell_size": jnp.mean(n),
        }

    return sequence_advantages(
        "agent_advantages",
        fn,
        group_size,
        prefix="drmas",
        zero_std=False,
        reads={keys.extra(agent_key)},
    )
