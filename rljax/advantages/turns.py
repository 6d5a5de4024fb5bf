"""Advantages for multi-turn episodes: per-turn returns, group baselines and GAE over turns.

A multi-turn row's completion holds, after the prompt, the policy's turn 0 (through its EOS),
the environment's observation tokens, policy turn 1, another observation, ..., and ends with a
policy turn; then padding. The batch describes it with
  completion_mask [B, T] bool: True on policy tokens only;
  extras["env_mask"] [B, T]: True (> 0) on observation tokens, disjoint from completion_mask;
  extras["turn_rewards"] [B, K] f32: the environment's reward r_k for the step after policy
    turn k (0 past the row's last turn; K is the largest number of turns);
  extras["num_turns"] [B]: n, the row's number of policy turns (cast to int32);
  rewards [B]: the episode's total reward.
Rows are contiguous groups of G samples of one task, as everywhere in rljax.

Three ways to turn these into token advantages:
  Trajectory level: the existing `group_advantages` (GRPO) and `leave_one_out_advantages`
    (RLOO) on `rewards`, the episode total, need nothing new. They broadcast each row's
    advantage over `completion_mask`, which already excludes the observation tokens, so the
    policy is credited for its own tokens only and observation tokens get exactly 0
    (tests/advantages/test_turns.py checks this).
  Turn level, critic-free: `turn_group_advantage_transform` compares each turn's discounted
    return-to-go with the mean over the group's samples that reached that turn (a per-turn
    group baseline, in the spirit of the turn-level credit assignment of "Reinforcing
    Multi-Turn Reasoning in LLM Agents via Turn-Level Credit Assignment", Zeng et al. 2025,
    arXiv 2505.11821).
  Turn level, with a critic: `turn_gae_transform` runs GAE over turns, a turn being one step
    of the MDP and its value the critic's value at the turn's first policy token (utterance-
    level values as in "ArCHer: Training Language Model Agents via Hierarchical Multi-Turn
    RL", Zhou et al. 2024, arXiv 2402.19446).

Turns are found from the masks (`turn_ids`): turn k is the k-th contiguous run of
`completion_mask`. An observation of zero tokens would merge two policy turns into one run;
the sampler must put at least one environment token between turns.
"""

import chex
import jax
import jax.numpy as jnp

from rljax.advantages.gae import RETURNS_KEY, VALUES_KEY, gae
from rljax.advantages.sequence import masked_stats
from rljax.core import keys
from rljax.core.batch import Batch, check_groups
from rljax.core.transform import Context, Metrics, Transform, stateless

ENV_MASK_KEY = "env_mask"
TURN_REWARDS_KEY = "turn_rewards"
NUM_TURNS_KEY = "num_turns"


def _as_bool(mask: jax.Array) -> jax.Array:
    """A bool mask from a bool or 0/1 numeric mask (set where > 0)."""
    mask = jnp.asarray(mask)
    return mask if mask.dtype == jnp.bool_ else mask > 0


def _run_starts(policy: jax.Array) -> jax.Array:
    """[B, T] bool: True on the first token of each contiguous run of `policy`."""
    previous = jnp.pad(policy[:, :-1], ((0, 0), (1, 0)))
    return policy & ~previous


def _reached(num_turns: jax.Array, max_turns: int) -> jax.Array:
    """[B, K] bool: turn k < num_turns (the row reached turn k)."""
    n = jnp.asarray(num_turns).astype(jnp.int32)
    return jnp.arange(max_turns)[None, :] < n[:, None]


def _check_gamma(gamma: float) -> None:
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma={gamma} must be in [0, 1]")


def _check_group_size(group_size: int) -> None:
    if group_size < 2:
        raise ValueError(
            f"group_size={group_size}: per-turn group baselines need at least 2 samples per "
            "task (a lone sample is its own baseline and always gets advantage 0)"
        )


def turn_ids(completion_mask: jax.Array, env_mask: jax.Array) -> jax.Array:
    """The turn index of each completion token, from the policy and environment masks.

    A policy token gets k when it belongs to the k-th contiguous run of `completion_mask`
    (0 for the first); an observation token gets the index of the policy turn it follows;
    padding gets -1 (and so would an observation before the first policy token).

    Args:
      completion_mask: [B, T] True (> 0) on policy tokens.
      env_mask: [B, T] True (> 0) on environment (observation) tokens, disjoint from
        `completion_mask` (a token in both counts as a policy token).

    Returns:
      [B, T] int32 turn indices, -1 off both masks.
    """
    chex.assert_rank([completion_mask, env_mask], 2)
    chex.assert_equal_shape([completion_mask, env_mask])
    policy = _as_bool(completion_mask)
    env = _as_bool(env_mask)
    ids = jnp.cumsum(_run_starts(policy), axis=1, dtype=jnp.int32) - 1
    return jnp.where(policy | env, ids, -1)


def turn_returns(turn_rewards: jax.Array, num_turns: jax.Array, gamma: float = 1.0) -> jax.Array:
    """Discounted return-to-go of each turn.

    R_k = sum_{j=k}^{n-1} gamma^(j-k) r_j with n the row's number of turns; entries of
    `turn_rewards` at k >= n are ignored and R_k = 0 there. The discount is per turn (one
    MDP step per turn), not per token.

    Args:
      turn_rewards: [B, K] reward after each policy turn.
      num_turns: [B] number of turns of each row (int, or float holding ints).
      gamma: discount in [0, 1].

    Returns:
      [B, K] float32 returns.
    """
    chex.assert_rank([turn_rewards, num_turns], [2, 1])
    chex.assert_equal_shape_prefix([turn_rewards, num_turns], 1)
    _check_gamma(gamma)
    b, k = turn_rewards.shape
    reached = _reached(num_turns, k)
    r = jnp.where(reached, turn_rewards.astype(jnp.float32), 0.0)

    def step(next_return, r_k):
        ret = r_k + gamma * next_return
        return ret, ret

    _, ret = jax.lax.scan(step, jnp.zeros(b, jnp.float32), r.T, reverse=True)
    return jnp.where(reached, ret.T, 0.0)


def turn_group_advantages(
    turn_rewards: jax.Array,
    num_turns: jax.Array,
    group_size: int,
    gamma: float = 1.0,
    scale_by_std: bool = True,
    eps: float = 1e-6,
    unbiased_std: bool = True,
) -> jax.Array:
    """Turn-level advantages with a per-turn group baseline.

    For a group and a turn k, let S_k be the group's samples that reached turn k
    (num_turns > k). Then A_k = R_k - mean_{S_k} R_k, with R the discounted return-to-go
    (`turn_returns`); with `scale_by_std`, divided by std_{S_k} R_k + eps (GRPO-style, see
    `rljax.advantages.group.grpo_advantages`). The std is over the same samples S_k and, as
    in `grpo_advantages`, unbiased (ddof=1, verl's torch.std) by default; `unbiased_std=False`
    gives the population std. Turns a sample did not reach get 0. A turn that only one
    sample of its group reached, or whose returns are equal over S_k, gets exactly 0 (no
    signal; no rounding residue divided by eps).

    Args:
      turn_rewards: [B, K] reward after each policy turn, B/G contiguous groups of G.
      num_turns: [B] number of turns of each row.
      group_size: G, samples per task (>= 2).
      gamma: discount in [0, 1] between turns.
      scale_by_std: divide by the per-turn group std.
      eps: added to the std.
      unbiased_std: use the ddof=1 std over S_k; False uses the population std.

    Returns:
      [B, K] float32 advantages.

    Raises:
      ValueError: if G < 2, G does not divide B, or gamma is outside [0, 1].
    """
    chex.assert_rank([turn_rewards, num_turns], [2, 1])
    _check_group_size(group_size)
    b, k = turn_rewards.shape
    if b % group_size:
        raise ValueError(f"group_size={group_size} does not divide batch {b}")
    ret = turn_returns(turn_rewards, num_turns, gamma).reshape(b // group_size, group_size, k)
    reached = _reached(num_turns, k).reshape(b // group_size, group_size, k)
    count = reached.sum(axis=1, keepdims=True)
    mean = jnp.where(reached, ret, 0.0).sum(axis=1, keepdims=True) / jnp.maximum(count, 1)
    hi = jnp.where(reached, ret, -jnp.inf).max(axis=1, keepdims=True)
    lo = jnp.where(reached, ret, jnp.inf).min(axis=1, keepdims=True)
    centered = jnp.where(reached & (hi != lo), ret - mean, 0.0)
    if scale_by_std:
        ddof = 1 if unbiased_std else 0
        var = jnp.sum(centered**2, axis=1, keepdims=True) / jnp.maximum(count - ddof, 1)
        centered = centered / (jnp.sqrt(var) + eps)
    return centered.reshape(b, k)


def turn_gae(
    turn_rewards: jax.Array,
    turn_values: jax.Array,
    num_turns: jax.Array,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[jax.Array, jax.Array]:
    """GAE(gamma, lambda) over the turns of each row, a turn being one MDP step.

    delta_k = r_k + gamma V_{k+1} - V_k with V_n = 0 after the row's last turn, and
    A_k = delta_k + gamma lambda A_{k+1}; returns G_k = A_k + V_k ("High-Dimensional
    Continuous Control Using Generalized Advantage Estimation", Schulman et al. 2016, arXiv
    1506.02438). With lambda = 1, A_k = R_k - V_k (R from `turn_returns`). Turns at
    k >= num_turns get A = G = 0 and their rewards and values are ignored.

    Args:
      turn_rewards: [B, K] reward after each policy turn.
      turn_values: [B, K] V of the state before each policy turn.
      num_turns: [B] number of turns of each row.
      gamma: discount in [0, 1] between turns.
      lam: GAE lambda in [0, 1].

    Returns:
      advantages [B, K] and returns [B, K], float32.
    """
    chex.assert_rank([turn_rewards, turn_values, num_turns], [2, 2, 1])
    chex.assert_equal_shape([turn_rewards, turn_values])
    chex.assert_equal_shape_prefix([turn_rewards, num_turns], 1)
    # Turns are a prefix of each row, so the token-level GAE over the reached turns is
    # exactly GAE over turns (the value after the last reached turn is 0).
    return gae(turn_rewards, turn_values, _reached(num_turns, turn_rewards.shape[1]), gamma, lam)


def broadcast_turns(
    per_turn: jax.Array, turn_ids: jax.Array, completion_mask: jax.Array
) -> jax.Array:
    """Per-turn values spread over each turn's policy tokens.

    Args:
      per_turn: [B, K] one value per turn.
      turn_ids: [B, T] turn index of each token (`turn_ids`).
      completion_mask: [B, T] True (> 0) on policy tokens.

    Returns:
      [B, T]: per_turn[b, turn_ids[b, t]] on policy tokens; exactly 0 on environment tokens,
      padding, and tokens of turns >= K (there is no value for them).
    """
    chex.assert_rank([per_turn, turn_ids, completion_mask], 2)
    chex.assert_equal_shape([turn_ids, completion_mask])
    chex.assert_equal_shape_prefix([per_turn, turn_ids], 1)
    k = per_turn.shape[1]
    valid = _as_bool(completion_mask) & (turn_ids >= 0) & (turn_ids < k)
    values = jnp.take_along_axis(per_turn, jnp.clip(turn_ids, 0, k - 1), axis=1)
    return jnp.where(valid, values, jnp.zeros((), per_turn.dtype))


def turn_start_values(
    values: jax.Array, turn_ids: jax.Array, completion_mask: jax.Array, max_turns: int
) -> jax.Array:
    """Each turn's value: the token value at the turn's first policy token.

    Args:
      values: [B, T] per-token values (the critic's V(s_t) before each token).
      turn_ids: [B, T] turn index of each token (`turn_ids`).
      completion_mask: [B, T] True (> 0) on policy tokens.
      max_turns: K, the number of turn slots.

    Returns:
      [B, K] float32: values[b, t_k] with t_k the first policy token of turn k; 0 for a turn
      the row does not have. Turns >= K are dropped.
    """
    chex.assert_rank([values, turn_ids, completion_mask], 2)
    chex.assert_equal_shape([values, turn_ids, completion_mask])
    b = values.shape[0]
    starts = _run_starts(_as_bool(completion_mask)) & (turn_ids >= 0) & (turn_ids < max_turns)
    slot = jnp.where(starts, turn_ids, max_turns)  # out of range: dropped
    rows = jnp.broadcast_to(jnp.arange(b)[:, None], slot.shape)
    picked = jnp.where(starts, values.astype(jnp.float32), 0.0)
    return jnp.zeros((b, max_turns), jnp.float32).at[rows, slot].add(picked, mode="drop")


def _turn_inputs(batch: Batch, name: str) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """(completion_mask, turn ids, turn rewards, num_turns int32) of a multi-turn batch."""
    for key in (ENV_MASK_KEY, TURN_REWARDS_KEY, NUM_TURNS_KEY):
        if key not in batch.extras:
            raise ValueError(
                f"{name} needs batch.extras[{key!r}] ({keys.KEYS[keys.extra(key)].doc}); "
                "collect multi-turn episodes that record env_mask, turn_rewards and num_turns"
            )
    mask = batch.completion_mask
    env_mask = batch.extras[ENV_MASK_KEY]
    turn_rewards = batch.extras[TURN_REWARDS_KEY]
    num_turns = batch.extras[NUM_TURNS_KEY]
    chex.assert_equal_shape([mask, env_mask])
    chex.assert_rank([turn_rewards, num_turns], [2, 1])
    return mask, turn_ids(mask, env_mask), turn_rewards, num_turns.astype(jnp.int32)


def turn_group_advantage_transform(
    group_size: int,
    gamma: float = 1.0,
    scale_by_std: bool = True,
    eps: float = 1e-6,
    unbiased_std: bool = True,
) -> Transform:
    """Transform: token advantages from per-turn group baselines (`turn_group_advantages`).

    Each policy token of turn k gets A_k of its row; observation tokens and padding get 0.
    Reads `completion_mask`, `group_id` and `batch.extras["env_mask"]`, `["turn_rewards"]`,
    `["num_turns"]`; `batch.rewards` (the episode total) is not used.

    Args:
      group_size: G, samples per task (>= 2).
      gamma: discount in [0, 1] between turns.
      scale_by_std: divide by the per-turn group std.
      eps: added to the std.
      unbiased_std: use the ddof=1 std (as `grpo_advantages` does by default).

    Returns:
      A stateless `Transform` writing `advantages`. Metrics:
      "turn_group/advantages/{mean,std,min,max}" over policy (completion_mask) tokens and
      "turn_group/num_turns_mean" (mean over rows).

    Raises:
      ValueError: at construction if G < 2 or gamma is outside [0, 1]; at apply if the batch
        lacks a multi-turn extras entry or `group_id` is not contiguous groups of G.
    """
    _check_group_size(group_size)
    _check_gamma(gamma)

    def fn(batch: Batch, ctx: Context) -> tuple[Batch, Metrics]:
        del ctx
        check_groups(batch.group_id, group_size)
        mask, ids, turn_rewards, num_turns = _turn_inputs(batch, "turn_group_advantage_transform")
        adv = turn_group_advantages(
            turn_rewards, num_turns, group_size, gamma, scale_by_std, eps, unbiased_std
        )
        token_adv = broadcast_turns(adv, ids, mask)
        metrics = masked_stats(token_adv, mask, "turn_group/advantages")
        metrics["turn_group/num_turns_mean"] = num_turns.astype(jnp.float32).mean()
        return batch.replace(advantages=token_adv), metrics

    reads = {keys.COMPLETION_MASK, keys.GROUP_ID, keys.ENV_MASK, keys.TURN_REWARDS, keys.NUM_TURNS}
    return stateless(fn, reads, {keys.ADVANTAGES})


def turn_gae_transform(gamma: float = 1.0, lam: float = 0.95) -> Transform:
    """Transform: token advantages and value targets from GAE over turns (`turn_gae`).

    Turn k's value V_k is the critic's value `batch.extras["old_values"]` at the first policy
    token of turn k (the state after the history and the latest observation). The turn
    advantages A_k and returns G_k = A_k + V_k are broadcast to the turn's policy tokens:
    `advantages` and `batch.extras["returns"]`, 0 on observation tokens and padding. The
    advantages are not whitened.

    What the critic then learns: `rljax.objectives.value.clipped_value_loss` regresses the
    new value at every token weighted by `loss_weights` (the policy tokens) on `returns`, so
    every policy token of turn k is regressed on the same target G_k, the turn's lambda-return
    (for lam = 1 the discounted return-to-go of the turn; for lam < 1 it bootstraps on the
    old value of turn k+1). The critic learns the expected turn return given the context so
    far, at the turn's first token (the value the advantages use) and, as an auxiliary
    target, at its later tokens; observation tokens are not regressed.

    Args:
      gamma: discount in [0, 1] between turns.
      lam: GAE lambda in [0, 1].

    Returns:
      A stateless `Transform`. Metrics: "turn_gae/advantages/{mean,std,min,max}" over policy
      tokens, "turn_gae/returns_mean" and "turn_gae/values_mean" over the reached turns.

    Raises:
      ValueError: at construction for gamma or lam outside [0, 1]; at apply if the batch
        lacks the critic's values or a multi-turn extras entry.
    """
    _check_gamma(gamma)
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam={lam} must be in [0, 1]")

    def fn(batch: Batch, ctx: Context) -> tuple[Batch, Metrics]:
        del ctx
        if VALUES_KEY not in batch.extras:
            raise ValueError(
                f"turn_gae_transform needs the critic's values in batch.extras[{VALUES_KEY!r}]; "
                "train with a critic (an algorithm with a value_loss, e.g. rljax.algorithms.ppo)"
            )
        mask, ids, turn_rewards, num_turns = _turn_inputs(batch, "turn_gae_transform")
        max_turns = turn_rewards.shape[1]
        values = turn_start_values(batch.extras[VALUES_KEY], ids, mask, max_turns)
        adv, returns = turn_gae(turn_rewards, values, num_turns, gamma, lam)
        token_adv = broadcast_turns(adv, ids, mask)
        token_returns = broadcast_turns(returns, ids, mask)
        reached = _reached(num_turns, max_turns)
        n = jnp.maximum(reached.sum(), 1)
        metrics = masked_stats(token_adv, mask, "turn_gae/advantages")
        metrics["turn_gae/returns_mean"] = jnp.where(reached, returns, 0.0).sum() / n
        metrics["turn_gae/values_mean"] = jnp.where(reached, values, 0.0).sum() / n
        extras = {**batch.extras, RETURNS_KEY: token_returns}
        return batch.replace(advantages=token_adv, extras=extras), metrics

    reads = {
        keys.COMPLETION_MASK,
        keys.ENV_MASK,
        keys.TURN_REWARDS,
        keys.NUM_TURNS,
        keys.OLD_VALUES,
    }
    return stateless(fn, reads, {keys.ADVANTAGES, keys.RETURNS})
