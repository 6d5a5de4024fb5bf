"""Declared batch keys: what each `Batch` field and `batch.extras` entry is, and who writes it.

A key is a string: a `Batch` field by name (`"rewards"`) or an extras entry prefixed with
`"extras."` (`"extras.clip_scale"`, see `extra`). Transforms declare the keys they read and
write (`Transform.reads`, `.writes`, `.optional_reads`), objectives the keys they read
(`declare_objective`). `check_algorithm` checks the declarations of an algorithm at build time,
and `algorithm_reads` gives what the steps must produce for it: the reference policy, the
per-token statistics of the prepare step, the driver's greedy baseline decode.

Producers outside the transforms (`KeyInfo.producer`):
  sampler: tokens, masks, rollout log-probs, MoE routes.
  collector: rewards, group ids, prompt ids, token-level rewards, the greedy baseline reward.
  prepare: old/ref log-probs, the old entropy and the registered per-token statistics
    (`rljax.train.statistics.register_token_statistic`).
  critic: the critic's values (prepare, for an algorithm with a value loss).
  transform: nobody but an earlier transform of the algorithm (advantages, IS weights, ...).
  update: the update's own forward pass, with gradients; objectives only (the trained
    policy's log-probs of a teacher's top-k tokens).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

EXTRAS = "extras."

# Producers whose keys are present before the transforms run.
SAMPLER, COLLECTOR, PREPARE, CRITIC, TRANSFORM, UPDATE = (
    "sampler",
    "collector",
    "prepare",
    "critic",
    "transform",
    "update",
)
_UPSTREAM = (SAMPLER, COLLECTOR, PREPARE)


class KeyInfo(NamedTuple):
    """What a declared key holds and who writes it.

    Attributes:
      shape: e.g. "[B, T] f32".
      doc: one line.
      producer: SAMPLER, COLLECTOR, PREPARE, CRITIC, TRANSFORM or UPDATE (see the module
        docstring).
      needs_reference: producing it needs the frozen reference policy in the train state.
      read_by: which built-in objectives/transforms read it (for error messages).
    """

    shape: str
    doc: str
    producer: str
    needs_reference: bool = False
    read_by: str = ""


def extra(name: str) -> str:
    """The key of `batch.extras[name]`: `"extras." + name`."""
    return EXTRAS + name


# Batch fields.
PROMPT_TOKENS = "prompt_tokens"
PROMPT_MASK = "prompt_mask"
COMPLETION_TOKENS = "completion_tokens"
COMPLETION_MASK = "completion_mask"
GROUP_ID = "group_id"
ROLLOUT_LOGPROBS = "rollout_logprobs"
OLD_LOGPROBS = "old_logprobs"
REF_LOGPROBS = "ref_logprobs"
REWARDS = "rewards"
ADVANTAGES = "advantages"
LOSS_WEIGHTS = "loss_weights"
# Extras entries.
PROMPT_ID = extra("prompt_id")
TOKEN_REWARDS = extra("token_rewards")
BASELINE_REWARD = extra("baseline_reward")
TEACHER_LOGPROBS = extra("teacher_logprobs")
TEACHER_TOPK_IDS = extra("teacher_topk_ids")
TEACHER_TOPK_LOGPROBS = extra("teacher_topk_logprobs")
POLICY_TOPK_LOGPROBS = extra("policy_topk_logprobs")
# What the driver's teacher sends with `teacher.top_k` > 0.
TEACHER_TOPK = frozenset({TEACHER_TOPK_IDS, TEACHER_TOPK_LOGPROBS})
ROUTES = extra("routes")
OLD_ENTROPY = extra("old_entropy")
OLD_SUM_SQ_PROB = extra("old_sum_sq_prob")
OLD_REF_HELLINGER = extra("old_ref_hellinger")
PROMPT_EMBEDDING = extra("prompt_embedding")
OLD_VALUES = extra("old_values")
RETURNS = extra("returns")
CLIP_SCALE = extra("clip_scale")
IS_WEIGHT = extra("is_weight")
COV_NOISE = extra("cov_noise")
ENTROPY_COEF = extra("entropy_coef")
CORRECT = extra("correct")
SEQUENCE_ADVANTAGE = extra("sequence_advantage")
AGENT_ID = extra("agent_id")
DIMENSION_WEIGHTS = extra("dimension_weights")
REWARD_COMPONENTS = extra("reward_components")
POLICY_VERSION = extra("policy_version")
POLICY_VERSION_LAST = extra("policy_version_last")
ENV_MASK = extra("env_mask")
TURN_REWARDS = extra("turn_rewards")
NUM_TURNS = extra("num_turns")

# What a policy-gradient objective reads, and what it applies when present.
PG_READS = frozenset({OLD_LOGPROBS, ADVANTAGES, LOSS_WEIGHTS, COMPLETION_MASK})
PG_OPTIONAL = frozenset({IS_WEIGHT})

KEYS: dict[str, KeyInfo] = {
    PROMPT_TOKENS: KeyInfo("[B, P] int32", "prompt tokens", SAMPLER),
    PROMPT_MASK: KeyInfo("[B, P] bool", "True on real prompt tokens", SAMPLER),
    COMPLETION_TOKENS: KeyInfo("[B, T] int32", "sampled completion tokens", SAMPLER),
    COMPLETION_MASK: KeyInfo("[B, T] bool", "True on real completion tokens", SAMPLER),
    ROLLOUT_LOGPROBS: KeyInfo("[B, T] f32", "the sampler's log-probs", SAMPLER),
    GROUP_ID: KeyInfo("[B] int32", "which prompt each sample answers", COLLECTOR),
    REWARDS: KeyInfo("[B] or [B, K] f32", "sequence rewards", COLLECTOR),
    LOSS_WEIGHTS: KeyInfo("[B, T] f32", "per-token loss weights (the mask at first)", COLLECTOR),
    OLD_LOGPROBS: KeyInfo("[B, T] f32", "log-probs of the policy before the update", PREPARE),
    REF_LOGPROBS: KeyInfo(
        "[B, T] f32", "log-probs of the frozen reference policy", PREPARE, needs_reference=True
    ),
    ADVANTAGES: KeyInfo(
        "[B, T] f32", "token advantages", TRANSFORM, read_by="the policy-gradient objectives"
    ),
    PROMPT_ID: KeyInfo("[B] int32", "stable dataset index of each sample's prompt", COLLECTOR),
    TOKEN_REWARDS: KeyInfo("[B, T] f32", "per-token rewards (reward.token_level)", COLLECTOR),
    BASELINE_REWARD: KeyInfo(
        "[B] f32", "reward of the prompt's greedy completion (the driver decodes it)", COLLECTOR
    ),
    TEACHER_LOGPROBS: KeyInfo(
        "[B, T] f32",
        "the teacher's log-probs of the sampled tokens (on-policy distillation; the driver "
        "scores them with teacher.run_dir's policy)",
        COLLECTOR,
    ),
    TEACHER_TOPK_IDS: KeyInfo(
        "[B, T, k] int32",
        "the teacher's k likeliest next tokens at each completion position (teacher.top_k)",
        COLLECTOR,
    ),
    TEACHER_TOPK_LOGPROBS: KeyInfo(
        "[B, T, k] f32", "the teacher's log-probs of those tokens (teacher.top_k)", COLLECTOR
    ),
    POLICY_TOPK_LOGPROBS: KeyInfo(
        "[B, T, k] f32",
        "the trained policy's log-probs of the teacher's top-k tokens (the update's pass, "
        "with gradients)",
        UPDATE,
    ),
    ROUTES: KeyInfo("[B, P + T, L, k] int32", "an MoE rollout's expert choices", SAMPLER),
    AGENT_ID: KeyInfo("[B] int32", "which agent wrote each sample (multi-agent)", COLLECTOR),
    DIMENSION_WEIGHTS: KeyInfo("[B, K] f32", "context-dependent reward weights", COLLECTOR),
    REWARD_COMPONENTS: KeyInfo(
        "[B, K] f32",
        "the K components of each sample's reward (the task's reward_components)",
        COLLECTOR,
        read_by="components_as_rewards",
    ),
    SEQUENCE_ADVANTAGE: KeyInfo(
        "[B] f32", "advantages chosen on the host (UEC-RL's driver)", COLLECTOR
    ),
    POLICY_VERSION: KeyInfo(
        "[B] int32", "the policy version (trainer step) that sampled each row", COLLECTOR
    ),
    POLICY_VERSION_LAST: KeyInfo(
        "[B] int32",
        "the newest policy version in each row (a partial rollout's swaps; else policy_version)",
        COLLECTOR,
    ),
    # Multi-turn episodes (`rljax.advantages.turns`).
    ENV_MASK: KeyInfo(
        "[B, T] bool",
        "True on environment (observation) tokens of multi-turn episodes",
        SAMPLER,
    ),
    TURN_REWARDS: KeyInfo(
        "[B, K] f32", "the environment's reward after each policy turn (0 past the last)", COLLECTOR
    ),
    NUM_TURNS: KeyInfo("[B] int32", "number of policy turns of each multi-turn episode", COLLECTOR),
    OLD_ENTROPY: KeyInfo("[B, T] f32", "entropy of the pre-update policy", PREPARE),
    # The prepare step's registered statistics (`rljax.train.statistics`).
    OLD_SUM_SQ_PROB: KeyInfo("[B, T] f32", "sum_v pi_old(v | s_t)^2", PREPARE),
    OLD_REF_HELLINGER: KeyInfo(
        "[B, T] f32", "1 - sum_v sqrt(pi_old pi_ref)", PREPARE, needs_reference=True
    ),
    PROMPT_EMBEDDING: KeyInfo("[B, D] f32", "mean final hidden state over the prompt", PREPARE),
    OLD_VALUES: KeyInfo("[B, T] f32", "the critic's values before the update", CRITIC),
    RETURNS: KeyInfo("[B, T] f32", "value targets (GAE)", TRANSFORM, read_by="clipped_value_loss"),
    CLIP_SCALE: KeyInfo(
        "[B] f32",
        "multiplies both clip ranges (GPRL's drift monitor)",
        TRANSFORM,
        read_by="ppo_clip",
    ),
    IS_WEIGHT: KeyInfo(
        "[B, T] f32",
        "rollout-correction importance weights (TIS, AIS)",
        TRANSFORM,
        read_by=(
            "ppo_clip, cispo, gspo, gspo_token, gpg, mu_grpo, segment_po, clip_cov, kl_cov, "
            "sapo, gmpo, dppo, ipo"
        ),
    ),
    ENTROPY_COEF: KeyInfo(
        "[B] f32",
        "this step's adaptive entropy coefficient (the same in every row)",
        TRANSFORM,
        read_by="adaptive_entropy_bonus",
    ),
    COV_NOISE: KeyInfo(
        "[B, T] f32", "uniform noise for Clip-Cov's picks", TRANSFORM, read_by="clip_cov"
    ),
    CORRECT: KeyInfo(
        "[B] bool",
        "correctness (ExpThink's rewards)",
        TRANSFORM,
        read_by="expthink_advantages",
    ),
}


def register_key(
    name: str,
    shape: str,
    doc: str,
    producer: str,
    needs_reference: bool = False,
    read_by: str = "",
    replace: bool = False,
) -> None:
    """Declares a new batch key (a user's extras entry, a new per-token statistic).

    Args:
      name: the key, "extras.<name>" for an extras entry.
      shape: its shape, e.g. "[B, T] f32".
      doc: one line.
      producer: SAMPLER, COLLECTOR, PREPARE, CRITIC or TRANSFORM.
      needs_reference: producing it needs the reference policy.
      read_by: who reads it (shown in error messages).
      replace: allow redeclaring an existing key.

    Raises:
      ValueError: for an unknown producer, or a declared name without `replace`.
    """
    if producer not in (*_UPSTREAM, CRITIC, TRANSFORM):
        raise ValueError(
            f"register_key({name!r}): producer={producer!r} is not one of "
            f"{[*_UPSTREAM, CRITIC, TRANSFORM]}"
        )
    if name in KEYS and not replace:
        raise ValueError(f"key {name!r} is already declared ({KEYS[name].doc}); pass replace=True")
    KEYS[name] = KeyInfo(shape, doc, producer, needs_reference, read_by)


def keyset(keys: Iterable[str] | None) -> frozenset[str] | None:
    """`frozenset(keys)`, None staying None (undeclared); a lone string is one key."""
    if keys is None:
        return None
    if isinstance(keys, str):
        return frozenset((keys,))
    return frozenset(keys)


def declare_objective(
    objective: Callable,
    reads: Iterable[str],
    optional_reads: Iterable[str] = (),
    name: str | None = None,
) -> Callable:
    """Attaches declared reads to an objective (or a value loss) and returns it.

    Args:
      objective: `(new_logprobs, new_entropy, batch) -> (loss, metrics)`.
      reads: keys it needs.
      optional_reads: keys it uses when present (IS weights, clip scales).
      name: its name in error messages (default: the enclosing factory's name).

    Returns:
      `objective`, with attributes `reads`, `optional_reads` and `key_name`.
    """
    objective.reads = keyset(reads)
    objective.optional_reads = keyset(optional_reads)
    objective.key_name = name or describe(objective)
    return objective


def describe(fn: Any) -> str:
    """A readable name: an explicit `key_name`, else the factory whose closure `fn` is."""
    explicit = getattr(fn, "key_name", None)
    if explicit:
        return explicit
    qualname = getattr(fn, "__qualname__", None) or type(fn).__name__
    return qualname.split(".<locals>")[0]


class Step(NamedTuple):
    """One declared reader/writer in an algorithm, in order (see `algorithm_steps`)."""

    name: str
    reads: frozenset[str] | None  # None: undeclared
    optional_reads: frozenset[str]
    writes: frozenset[str] | None


def transform_steps(transform: Any) -> list[Step]:
    """The members of a (possibly chained) transform, flattened in order."""
    members = getattr(transform.apply, "members", None)
    if members is not None:  # a chain: its members, each with its own name
        return [s for m in members for s in transform_steps(m)]
    name = describe(transform.apply)
    return [Step(name, transform.reads, transform.optional_reads, transform.writes)]


def objective_steps(objective: Any) -> list[Step]:
    """The members of a (possibly summed) objective."""
    if objective is None:
        return []
    members = getattr(objective, "members", None)
    if members is not None:
        return [s for m in members for s in objective_steps(m)]
    return [
        Step(
            describe(objective),
            getattr(objective, "reads", None),
            getattr(objective, "optional_reads", None) or frozenset(),
            frozenset(),
        )
    ]


def algorithm_steps(algorithm: Any) -> list[Step]:
    """The transforms, then the objective terms, then the value loss, as declared."""
    return [
        *transform_steps(algorithm.transform),
        *objective_steps(algorithm.objective),
        *objective_steps(getattr(algorithm, "value_loss", None)),
    ]


def algorithm_reads(algorithm: Any) -> frozenset[str]:
    """The keys the algorithm needs from outside its transforms (required reads only).

    A read that an earlier transform writes is not counted; undeclared members add nothing.
    Optional reads never make the steps compute anything.
    """
    written: set[str] = set()
    needed: set[str] = set()
    for step in algorithm_steps(algorithm):
        if step.reads is not None:
            needed |= step.reads - written
        if step.writes is not None:
            written |= step.writes
    return frozenset(needed)


def needs_reference(algorithm: Any) -> bool:
    """Whether anything read needs the frozen reference policy (ref log-probs, DGPO's
    Hellinger deviation, ...)."""
    return any(KEYS[k].needs_reference for k in algorithm_reads(algorithm) if k in KEYS)


def check_algorithm(algorithm: Any) -> None:
    """Checks an algorithm's declarations: every read has a producer, every write a reader.

    A key read is produced upstream (sampler, collector, prepare; the critic's values when
    the algorithm has a value loss) or written by an earlier transform. An extras key written
    by a transform must be read (or optionally read) by a later transform or objective term:
    otherwise it is silently dropped (GPRL's clip scale under CISPO). Undeclared members
    (`Transform(init, apply)`, plain objective functions) are skipped; after one, a missing
    producer or reader is not reported (it may be the undeclared member).

    Args:
      algorithm: an `rljax.algorithms.Algorithm`.

    Raises:
      ValueError: one line naming the reader and the key, or the writer, the key and who
        could read it.
    """
    steps = algorithm_steps(algorithm)
    n_transforms = len(transform_steps(algorithm.transform))
    has_critic = getattr(algorithm, "value_loss", None) is not None
    written: dict[str, str] = {}
    unknown_before = False
    for i, step in enumerate(steps):
        if step.reads is None:
            unknown_before = True
            continue
        for key in sorted(step.reads):
            if key in written or unknown_before:
                continue
            info = KEYS.get(key)
            if info is None:
                raise ValueError(
                    f"{step.name} reads {key!r}, which nothing produces: no earlier transform "
                    "writes it and it is not a declared key (rljax.core.keys.register_key)"
                )
            if info.producer in _UPSTREAM:
                continue
            if info.producer == UPDATE:
                if i >= n_transforms:
                    continue
                raise ValueError(
                    f"{step.name} reads {key!r} ({info.doc}), which only the update's forward "
                    "pass produces: only an objective term can read it"
                )
            if info.producer == CRITIC:
                if has_critic:
                    continue
                raise ValueError(
                    f"{step.name} reads {key!r} ({info.doc}), which only the critic produces; "
                    "give the algorithm a value_loss"
                )
            raise ValueError(
                f"{step.name} reads {key!r} ({info.doc}), but no earlier transform writes it; "
                "add the transform that produces it before this one"
            )
        for key in sorted(step.writes or ()):
            written[key] = step.name
            if not key.startswith(EXTRAS):
                continue
            later = steps[i + 1 :]
            if any(s.reads is None or key in s.reads or key in s.optional_reads for s in later):
                continue
            info = KEYS.get(key)
            who = f"; it is read by {info.read_by}" if info is not None and info.read_by else ""
            after = ", ".join(s.name for s in later) or "nothing"
            raise ValueError(
                f"{step.name} writes {key!r} but nothing after it reads it (after it: {after}){who}"
            )
