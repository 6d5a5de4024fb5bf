"""IBPO: implicit process advantages from the prefix tree of a prompt's sampled responses.

Papers: arXiv 2605.16302 (earlier version arXiv 2604.13088). The rule below is an
interpretation (spec section 15, [INTERP]).
"""

import chex
import jax
import jax.numpy as jnp

from rljax.advantages.group import masked_stats
from rljax.core import keys
from rljax.core.batch import Batch, check_groups, check_sequence_rewards, equal_reward_fraction
from rljax.core.transform import Context, Metrics, Transform, stateless


def _check_group_size(group_size: int) -> None:
    if group_size < 2:
        raise ValueError(
            f"group_size={group_size}: prefix-tree advantages compare the responses of a "
            "prompt and need at least 2 of them; sample G >= 2 completions per prompt"
        )


def _prefix_values(
    completion_tokens: jax.Array, completion_mask: jax.Array, rewards: jax.Array, group_size: int
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Node values along every response and at each valid token's parent node.

    Returns:
      value: [B, T] V_{i,t}, mean reward of the group's responses passing through p_{<=t}.
      count: [B, T] how many responses pass through p_{<=t} (>= 1).
      parent_value, parent_count: [B, T] the same at i's previous valid position (the
        root, i.e. the group mean over G, before the first one).
    """
    b, t = completion_tokens.shape
    n = b // group_size
    tok = completion_tokens.reshape(n, group_size, t)
    valid = completion_mask.reshape(n, group_size, t).astype(bool)
    r = rewards.reshape(n, group_size).astype(jnp.float32)
    # agree[g, i, j, s]: j matches i at position s (same validity; same token if valid).
    same_valid = valid[:, :, None, :] == valid[:, None, :, :]
    same_tok = tok[:, :, None, :] == tok[:, None, :, :]
    agree = same_valid & (~valid[:, :, None, :] | same_tok)
    passes = jnp.cumprod(agree.astype(jnp.float32), axis=-1)  # [n, G(i), G(j), T], over s <= t
    count = passes.sum(axis=2)  # [n, G, T], over j
    value = jnp.einsum("gijt,gj->git", passes, r) / count  # count >= 1: j = i always agrees
    # Parent of token t: i's last valid position before t, or the root (-1).
    pos = jnp.where(valid, jnp.arange(t), -1)
    last = jax.lax.cummax(pos, axis=pos.ndim - 1)
    prev = jnp.concatenate([jnp.full((n, group_size, 1), -1), last[..., :-1]], axis=-1)
    safe = jnp.maximum(prev, 0)
    at_root = prev < 0
    parent_value = jnp.where(
        at_root, r.mean(axis=1)[:, None, None], jnp.take_along_axis(value, safe, axis=-1)
    )
    parent_count = jnp.where(at_root, float(group_size), jnp.take_along_axis(count, safe, axis=-1))
    return (
        value.reshape(b, t),
        count.reshape(b, t),
        parent_value.reshape(b, t),
        parent_count.reshape(b, t),
    )


def prefix_tree_advantages(
    completion_tokens: jax.Array,
    completion_mask: jax.Array,
    rewards: jax.Array,
    group_size: int,
) -> jax.Array:
    """Token-level advantages from the prefix tree of each group's responses (IBPO).

    Interpretation of IBPO (arXiv 2605.16302, earlier arXiv 2604.13088; spec section 15
    [INTERP]). Within a contiguous group of G responses, response j passes through i's
    prefix p_{<=t} when j's tokens 0..t are valid and equal to i's. The node value
    V_{i,t} is the mean reward of the responses passing through p_{<=t}, V_{i,-1} the group
    mean (the root), and

      A_{i,t} = V_{i,t} - V_{i,t-1} on valid tokens, 0 elsewhere.

    A token credits the change in expected reward caused by choosing it: tokens on a prefix
    shared by all responses, and any token after the branch where i's path becomes unique,
    get exactly 0 (a node with the same set of responses as its parent gets 0, no rounding
    residue). The sum over a row's valid tokens telescopes to (mean reward of the responses
    that contain i's whole response as a prefix) - group mean, i.e. r_i - mean when no other
    response starts with all of i (always the case when responses end with EOS).

    Masks are normally prefixes (valid through EOS). For a mask with holes (interpretation),
    a masked position matches only a masked position of the other response, whatever its
    token, and a valid token's parent is i's previous valid position, so the telescoping
    above still holds. Cost: [B/G, G, G, T] prefix-agreement cumprods.

    Args:
      completion_tokens: [B, T] int tokens, laid out as B/G contiguous groups.
      completion_mask: [B, T] bool, True on valid tokens.
      rewards: [B] sequence rewards.
      group_size: G, responses per prompt (>= 2).

    Returns:
      [B, T] float32 advantages, 0 on masked tokens.

    Raises:
      ValueError: if G < 2 or G does not divide B.
    """
    chex.assert_rank([completion_tokens, completion_mask, rewards], [2, 2, 1])
    chex.assert_equal_shape([completion_tokens, completion_mask])
    chex.assert_equal_shape_prefix([completion_tokens, rewards], 1)
    b = rewards.shape[0]
    _check_group_size(group_size)
    if b % group_size:
        raise ValueError(f"group_size={group_size} does not divide batch {b}")
    value, count, parent_value, parent_count = _prefix_values(
        completion_tokens, completion_mask, rewards, group_size
    )
    # Nodes are nested, so equal counts mean the same responses: the value did not change.
    branch = completion_mask.astype(bool) & (count != parent_count)
    return jnp.where(branch, value - parent_value, 0.0)


def implicit_process_advantages(group_size: int) -> Transform:
    """Transform writing IBPO's prefix-tree token advantages to `batch.advantages`.

    `batch.advantages = prefix_tree_advantages(completion_tokens, completion_mask, rewards)`
    (IBPO, arXiv 2605.16302, interpretation). Unlike the sequence-level estimators, tokens
    of one response get different advantages: credit goes to the tokens where the response
    leaves the other responses of its group.

    Args:
      group_size: G, responses per prompt (>= 2).

    Returns:
      A stateless `Transform`. Metrics: "ibpo/advantages/{mean,std,min,max}" over valid
      (completion_mask) tokens, "ibpo/branch_token_frac" (fraction of valid tokens where the
      set of responses sharing the prefix shrinks, the only tokens that can get credit) and
      "ibpo/zero_std_frac" (fraction of groups with all-equal rewards).

    Raises:
      ValueError: at construction if G < 2; at apply if rewards are not [B] or
        `batch.group_id` is not contiguous groups of G (see `check_groups`).
    """
    _check_group_size(group_size)

    def fn(batch: Batch, ctx: Context) -> tuple[Batch, Metrics]:
        del ctx
        check_sequence_rewards(batch.rewards, "implicit_process_advantages")
        check_groups(batch.group_id, group_size)
        mask = batch.completion_mask
        _, count, _, parent_count = _prefix_values(
            batch.completion_tokens, mask, batch.rewards, group_size
        )
        adv = prefix_tree_advantages(batch.completion_tokens, mask, batch.rewards, group_size)
        branch = mask & (count != parent_count)
        metrics = masked_stats(adv, mask, "ibpo/advantages")
        metrics["ibpo/branch_token_frac"] = branch.sum() / jnp.maximum(mask.sum(), 1)
        metrics["ibpo/zero_std_frac"] = equal_reward_fraction(batch.rewards, group_size)
        return batch.replace(advantages=adv), metrics

    reads = {keys.REWARDS, keys.GROUP_ID, keys.COMPLETION_MASK, keys.COMPLETION_TOKENS}
    return stateless(fn, reads, {keys.ADVANTAGES})
