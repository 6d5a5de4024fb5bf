"""Where the old policy's log-probs come from (`train.old_logprobs`), decided from declarations.

The PPO-style objectives take their ratio against `batch.old_logprobs`, the policy before the
update. Three sources (`OLD_LOGPROBS_MODES`):

  "recompute": the prepare step runs a forward pass of the pre-update policy (the classic
    layout; verl's and OpenRLHF's default).
  "sampler": the sampler's own log-probs (`batch.rollout_logprobs`) are the old policy, for any
    number of epochs and minibatches (verl's "bypass" mode). The prepare step runs the
    pre-update forward pass only when something needs its states (below).
  "auto": when the update is on-policy (one epoch, one minibatch: micro-batches only
    accumulate gradients), the policy at the update's forward pass is the old policy, so the
    old log-probs are that forward's own detached log-probs (`jax.lax.stop_gradient` inside the
    loss: the ratio is exactly 1 and the PPO-clip gradient is the policy gradient), as TRL and
    Tunix do; the prepare step then runs no pass of the policy. Off-policy, or when something
    reads the old policy before the update, "auto" recomputes.

What reads the old policy before the update (the keys come from `rljax.core.keys`):
  - a transform that reads (or optionally reads, or writes) `old_logprobs`: TIS/MIS/AIS weights,
    KL-in-reward, GAE's KL penalty, Entrocraft's covariance selection, the optimal token
    baseline, the exploration bias, ...;
  - anything that reads `extras.old_entropy` (Entrocraft, DGPO) or a registered per-token
    statistic (`rljax.train.statistics`): they need the pre-update policy's states;
  - a critic that is a value head on the policy (its values read the policy's hidden states);
    a critic with its own trunk runs its own pass and needs no policy pass;
  - a transform with undeclared reads: it may read any of the above.

Metrics: every name is logged in every mode. When prepare runs the pass, "entropy",
"kl_to_ref", "mismatch/*" (trainer vs sampler) and "entropy/cov_logp_adv" are measured there
on the trainer's log-probs (under "sampler" too: the mismatch stays the trainer's gap to the
sampler, not 0). Without the pass the update measures them from its first epoch's detached
forward passes, each row once: on-policy that is the pre-update policy itself (the same values
to float32 rounding); under "sampler" with several minibatches, the rows of minibatch k are
measured after k optimizer steps.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from rljax.core import keys

OLD_LOGPROBS_MODES = ("auto", "recompute", "sampler")

# Where `batch.old_logprobs` comes from (`OldPolicy.source`).
PREPARE, UPDATE, SAMPLER = "prepare", "update", "sampler"


class OldPolicy(NamedTuple):
    """The plan for the old policy of one run (`old_policy_plan`).

    Attributes:
      source: PREPARE (the prepare step's forward pass), UPDATE (the detached log-probs of the
        update's own forward pass) or SAMPLER (`batch.rollout_logprobs`).
      prepare_pass: whether the prepare step runs the pre-update policy's forward pass. When
        it does not, the update measures the pre-update metrics ("entropy", "kl_to_ref",
        "mismatch/*", "entropy/cov_logp_adv") from its first epoch's forward passes.
      reason: one line, why (for logs and tests).
    """

    source: str
    prepare_pass: bool
    reason: str


def readers_before_update(algorithm: Any, critic_has_trunk: bool) -> tuple[list[str], list[str]]:
    """Who reads the old policy before the update, from the algorithm's declarations.

    Args:
      algorithm: an `rljax.algorithms.Algorithm`.
      critic_has_trunk: the critic (if any) has its own network (`critic_graphdef` given).

    Returns:
      (log-prob readers, state readers): names of the transforms that read, optionally read or
      write `old_logprobs` (or are undeclared), and of whatever needs the pre-update policy's
      forward pass itself (entropy, registered statistics, a value head on the policy,
      undeclared transforms).
    """
    logprob_readers, state_readers = [], []
    for step in keys.transform_steps(algorithm.transform):
        if step.reads is None:  # may read anything
            logprob_readers.append(f"{step.name} (undeclared)")
            state_readers.append(f"{step.name} (undeclared)")
            continue
        if step.writes is None or keys.OLD_LOGPROBS in step.reads | step.optional_reads | (
            step.writes
        ):
            logprob_readers.append(step.name)
        if keys.OLD_ENTROPY in step.reads | step.optional_reads:
            state_readers.append(f"{step.name} ({keys.OLD_ENTROPY})")
    entropy_readers = any(keys.OLD_ENTROPY in name for name in state_readers)
    if keys.OLD_ENTROPY in algorithm.reads and not entropy_readers:
        state_readers.append(f"an objective term ({keys.OLD_ENTROPY})")
    state_readers += [f"statistic {name}" for name in algorithm.batch_stats]
    if algorithm.value_loss is not None and not critic_has_trunk:
        state_readers.append("the value head on the policy")
    return logprob_readers, state_readers


def old_policy_plan(
    mode: str,
    algorithm: Any,
    epochs: int,
    minibatches: int,
    critic_has_trunk: bool = False,
) -> OldPolicy:
    """Decides where the old log-probs come from and whether prepare runs the old pass.

    Args:
      mode: one of `OLD_LOGPROBS_MODES` (`train.old_logprobs`).
      algorithm: an `rljax.algorithms.Algorithm` (its declared reads decide).
      epochs, minibatches: the update's schedule; on-policy is 1 x 1.
      critic_has_trunk: the critic has its own network (no policy pass needed for values).

    Returns:
      An `OldPolicy`.

    Raises:
      ValueError: for an unknown mode.
    """
    if mode not in OLD_LOGPROBS_MODES:
        raise ValueError(f"old_logprobs={mode!r} is unknown; use one of {OLD_LOGPROBS_MODES}")
    if mode == "recompute":
        return OldPolicy(PREPARE, True, "train.old_logprobs='recompute'")
    logprob_readers, state_readers = readers_before_update(algorithm, critic_has_trunk)
    if mode == "sampler":
        if state_readers:
            return OldPolicy(SAMPLER, True, f"the old pass runs for {', '.join(state_readers)}")
        return OldPolicy(SAMPLER, False, "nothing needs the old policy's states")
    if epochs != 1 or minibatches != 1:
        return OldPolicy(
            PREPARE, True, f"off-policy update (epochs={epochs}, minibatches={minibatches})"
        )
    readers = sorted(set(logprob_readers) | set(state_readers))
    if readers:
        return OldPolicy(PREPARE, True, f"read before the update by {', '.join(readers)}")
    return OldPolicy(UPDATE, False, "on-policy: the update's detached log-probs")
