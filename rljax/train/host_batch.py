"""`HostBatch`: sampled, scored rows on the host, laid out as contiguous prompt groups.

Every collector speaks this one type: the rollout step's output becomes a HostBatch, refill,
rescue, replay and buffers select and join HostBatches, and the driver turns each into a
device `Batch` right before it learns from it. Rows are numpy arrays with leading dim B =
groups x G; row i * G + j is sample j of group i.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from rljax.core.batch import Batch, make_batch
from rljax.rollout.cuts import training_rollout_logprobs
from rljax.rollout.sampler import Rollout

# The fields every HostBatch has ([B, P] prompt, [B, T] completion and sampler log-probs,
# [B] rewards and task indices); any other field becomes `Batch.extras[name]`.
SAMPLE_FIELDS = (
    "prompt_tokens",
    "prompt_mask",
    "completion_tokens",
    "completion_mask",
    "rollout_logprobs",
    "rewards",
)
REQUIRED_FIELDS = (*SAMPLE_FIELDS, "prompt_id")
# Fields with one entry per completion token ([B, T, ...]) and per prompt + completion position
# ([B, P + T, ...]): `HostBatch.trimmed` cuts them with the completions.
COMPLETION_FIELDS = (
    "completion_tokens",
    "completion_mask",
    "rollout_logprobs",
    "token_rewards",
    "is_weight",
    "env_mask",
    "teacher_logprobs",
    "teacher_topk_ids",
    "teacher_topk_logprobs",
)
SEQUENCE_FIELDS = ("routes",)
# Extras that stay integers in the Batch (MoE expert choices, policy versions, a teacher's
# top-k token ids) and booleans
# (the environment tokens of multi-turn episodes, `rljax.core.batch.context_mask`); the
# others are float32.
_INT_EXTRAS = ("routes", "policy_version", "policy_version_last", "teacher_topk_ids")
_BOOL_EXTRAS = ("env_mask",)


@dataclasses.dataclass(frozen=True)
class HostBatch:
    """Rows of sampled completions with their rewards, grouped by prompt.

    Attributes:
      rows: field -> [B, ...] numpy array; `REQUIRED_FIELDS` plus any extras
        ("baseline_reward", "token_rewards", "routes", "sequence_advantage", "is_weight",
        "policy_version", "env_mask", ...). `prompt_id` is each row's task index.
      group_size: G, rows per prompt group (1: every row is its own group).
    """

    rows: dict[str, np.ndarray]
    group_size: int

    def __post_init__(self):
        missing = [f for f in REQUIRED_FIELDS if f not in self.rows]
        if missing:
            raise ValueError(f"HostBatch rows lack fields {missing}; it needs {REQUIRED_FIELDS}")
        sizes = {k: len(v) for k, v in self.rows.items()}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"HostBatch fields have different row counts: {sizes}")
        if self.group_size < 1 or len(self) % self.group_size:
            raise ValueError(
                f"HostBatch of {len(self)} rows cannot hold groups of {self.group_size}"
            )

    def __len__(self) -> int:
        return len(self.rows["rewards"])

    @property
    def num_groups(self) -> int:
        return len(self) // self.group_size

    @classmethod
    def from_rollout(
        cls, out: Rollout, prompt_ids: np.ndarray, rewards: np.ndarray, group_size: int
    ) -> HostBatch:
        """The rows of a rollout of `len(prompt_ids)` prompts x G samples, with their rewards.

        CUTS rows train on the policy's log-probs (treated as on-policy, as the paper does);
        an MoE rollout's expert choices are kept as "routes" (replayed in training), a
        multi-turn rollout's environment tokens as "env_mask".
        """
        rows = {
            "prompt_tokens": np.asarray(out.prompt_tokens),
            "prompt_mask": np.asarray(out.prompt_mask),
            "completion_tokens": np.asarray(out.completion_tokens),
            "completion_mask": np.asarray(out.completion_mask),
            "rollout_logprobs": np.asarray(
                training_rollout_logprobs(out.sampling_logprobs, out.policy_logprobs, out.cuts_rows)
            ),
            "rewards": np.asarray(rewards),
            "prompt_id": np.repeat(np.asarray(prompt_ids, np.int64), group_size),
        }
        if out.routes is not None:
            rows["routes"] = np.asarray(out.routes)
        if out.env_mask is not None:  # multi-turn episodes: the observations' tokens
            rows["env_mask"] = np.asarray(out.env_mask)
        if out.policy_versions is not None:  # a partial rollout: its oldest and newest version
            versions, mask = np.asarray(out.policy_versions), np.asarray(out.completion_mask)
            first = versions[:, 0]  # rows without tokens: the version they started with
            oldest = np.where(mask, versions, np.iinfo(np.int32).max).min(1)
            rows["policy_version"] = np.where(mask.any(1), oldest, first)
            rows["policy_version_last"] = np.where(mask, versions, first[:, None]).max(1)
        return cls(rows, group_size)

    @classmethod
    def from_groups(cls, groups: dict[str, np.ndarray], group_size: int) -> HostBatch:
        """The inverse of `grouped`: arrays [n, G, ...] -> rows [n * G, ...]."""
        return cls({k: v.reshape(-1, *v.shape[2:]) for k, v in groups.items()}, group_size)

    def grouped(self) -> dict[str, np.ndarray]:
        """Every field viewed as [n_groups, G, ...]."""
        n, g = self.num_groups, self.group_size
        return {k: v.reshape(n, g, *v.shape[1:]) for k, v in self.rows.items()}

    def take_groups(self, keep: np.ndarray) -> HostBatch:
        """The groups selected by a [n_groups] bool mask or an index array, in that order."""
        return HostBatch.from_groups(
            {k: v[keep] for k, v in self.grouped().items()}, self.group_size
        )

    def with_rows(self, **fields: np.ndarray) -> HostBatch:
        """A copy with `fields` added or replaced ([B, ...] each)."""
        return HostBatch({**self.rows, **fields}, self.group_size)

    @staticmethod
    def concat(parts: Sequence[HostBatch]) -> HostBatch:
        """The groups of all parts, in order (they must share G and fields)."""
        sizes = {p.group_size for p in parts}
        if len(sizes) != 1:
            raise ValueError(f"cannot concatenate HostBatches of group sizes {sorted(sizes)}")
        return HostBatch(
            {k: np.concatenate([p.rows[k] for p in parts]) for k in parts[0].rows},
            parts[0].group_size,
        )

    def trimmed(self, prompt_width: int, completion_width: int) -> HostBatch:
        """The last `prompt_width` prompt columns and the first `completion_width` completion
        columns of every row (per-position fields cut alike); for dropping padding columns,
        see `rljax.train.padding`."""
        full = self.rows["prompt_tokens"].shape[1]
        full_completion = self.rows["completion_tokens"].shape[1]
        if not (0 < prompt_width <= full and 0 < completion_width <= full_completion):
            raise ValueError(
                f"widths ({prompt_width}, {completion_width}) are not in 1..{full} and "
                f"1..{full_completion}"
            )
        start = full - prompt_width
        rows = {}
        for key, value in self.rows.items():
            if key in ("prompt_tokens", "prompt_mask"):
                value = value[:, start:]
            elif key in COMPLETION_FIELDS:
                value = value[:, :completion_width]
            elif key in SEQUENCE_FIELDS:
                value = value[:, start : full + completion_width]
            rows[key] = value
        return HostBatch(rows, self.group_size)

    def to_batch(self) -> Batch:
        """The device `Batch`: group ids 0..n-1 in row order, every non-sample field (and
        `prompt_id`, cast to int32 modulo 2**31) in `extras`."""
        ids = np.asarray(self.rows["prompt_id"], np.int64) % 2**31
        extras = {"prompt_id": jnp.asarray(ids, jnp.int32)}
        for key, value in self.rows.items():
            if key not in REQUIRED_FIELDS:
                if key in _BOOL_EXTRAS:
                    extras[key] = jnp.asarray(np.asarray(value) > 0)
                else:
                    dtype = jnp.int32 if key in _INT_EXTRAS else jnp.float32
                    extras[key] = jnp.asarray(value, dtype)
        return make_batch(
            self.rows["prompt_tokens"],
            self.rows["prompt_mask"],
            self.rows["completion_tokens"],
            self.rows["completion_mask"],
            np.repeat(np.arange(self.num_groups), self.group_size),
            self.rows["rewards"],
            rollout_logprobs=self.rows["rollout_logprobs"],
            extras=extras,
        )
