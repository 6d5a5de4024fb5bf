"""LoPE in the driver: all-failed groups get correct completions from perturbed prompts.

LoPE (arXiv 2605.05566, `rljax.data.samplers.lope`): when every sample of a prompt fails,
GRPO learns nothing from it. LoPE rolls the prompt out again behind meaningless Lorem-Ipsum
prefixes and lets the correct completions replace up to G - 1 of the failures, trained under
the ORIGINAL prompt. Here:

- the prefix (and a blank line) goes right before the prompt's text, after the BOS, in token
  space; a prefix longer than the room left in `prompt_len` keeps its last words
  (interpretation: the authors put it in the system turn of a chat template);
- the perturbed prompts of a draw are rolled out in one call, their count padded to a power of
  two (few compilations); completions are scored against the original answer;
- replaced samples get their `rollout_logprobs` rescored by the current policy under the
  original prompt, so the mismatch statistics and corrections see the prompt trained on.

Not here: LoPE's pooled advantage statistics (base + perturbed scores).
"""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp
import numpy as np

from rljax.data.samplers.lope import LoPESettings, all_failed, lorem_prefix, merge
from rljax.data.tasks import Task
from rljax.models.tokenizer import Tokenizer
from rljax.rewards import score_completions
from rljax.rollout.rescore import LogprobsFn, rescore
from rljax.rollout.sampler import Rollout
from rljax.train.host_batch import SAMPLE_FIELDS
from rljax.train.scoring import Scorer, score_rollout
from rljax.train.uec import bucket_size

# Offsets the perturbed rollouts' randomness from the step's own draws (`attempt` salts keys).
_SALT = 1 << 16


class LoPERescue:
    """Rescues the all-failed groups of each draw (the `rljax.train.draws.WithRescue` hook).

    Args:
      settings: LoPE's settings (`pooled_stats` is not supported here).
      task: scores the perturbed completions against the original answers.
      tokenizer: encodes the prefixes; its BOS stays first.
      prompt_len: P', the padded length of perturbed prompts (> the run's prompt length).
      seed: with the step and the draw, seeds the prefixes and the merge.
      prompt_multiple: perturbed prompt counts are padded to a multiple of this.
      scorer: runs the task's reward (`rljax.train.scoring.Scorer`).
    """

    def __init__(
        self,
        settings: LoPESettings,
        task: Task,
        tokenizer: Tokenizer,
        prompt_len: int,
        seed: int,
        prompt_multiple: int = 1,
        scorer: Scorer = score_completions,
    ):
        if settings.pooled_stats:
            raise ValueError("LoPE's pooled_stats is not supported by the driver; leave it off")
        self.settings = settings
        self.task = task
        self.tokenizer = tokenizer
        self.prompt_len = int(prompt_len)
        self.seed = int(seed)
        self.prompt_multiple = int(prompt_multiple)
        self.scorer = scorer

    def perturb(self, tokens: np.ndarray, mask: np.ndarray, rng: np.random.Generator):
        """`num_perturbed` left-padded [P'] copies of one prompt, each behind its own prefix."""
        real = [int(t) for t in np.asarray(tokens)[np.asarray(mask, bool)]]
        bos = self.tokenizer.bos_id
        head, body = (
            (real[:1], real[1:]) if real and bos is not None and real[0] == bos else ([], real)
        )
        room = self.prompt_len - len(real)
        if room < 0:
            raise ValueError(
                f"a prompt of {len(real)} tokens does not fit lope.max_prompt_len="
                f"{self.prompt_len}; raise it above task.max_prompt_len"
            )
        s = self.settings
        out_tokens = np.full((s.num_perturbed, self.prompt_len), self.tokenizer.pad_id, np.int32)
        out_mask = np.zeros((s.num_perturbed, self.prompt_len), bool)
        for j in range(s.num_perturbed):
            prefix = self.tokenizer.encode(lorem_prefix(rng, s.min_words, s.max_words) + "\n\n")
            row = head + (prefix[-room:] if room else []) + body
            out_tokens[j, self.prompt_len - len(row) :] = row
            out_mask[j, self.prompt_len - len(row) :] = True
        return out_tokens, out_mask

    def __call__(
        self,
        step: int,
        rollout: Callable[[jnp.ndarray, jnp.ndarray, int], Rollout],
        logprobs: LogprobsFn,
        prompts: dict,
        groups: dict[str, np.ndarray],
        attempt: int,
    ) -> dict[str, float]:
        """Rescues the all-failed groups of `groups` in place; returns counts as metrics.

        Args:
          step: the loop step (seeds the prefixes with `attempt`).
          rollout: the perturbed-prompt sampler, (tokens, mask, attempt) -> `Rollout` with
            `rollouts_per_perturbed` samples per prompt.
          logprobs: the current policy's log-prob function, for rescoring replaced samples.
          prompts: the drawn prompt batch (its answers score the perturbed completions).
          groups: the collector's per-group rows ([n_prompts, G, ...]).
          attempt: the draw within the step (DAPO refills draw more than once).

        Returns:
          "lope/failed_groups", "lope/rescued_groups" (got at least one correct completion),
          "lope/replaced_samples", "lope/perturbed_correct" and "lope/perturbed_samples".
        """
        s = self.settings
        n, g = groups["rewards"].shape
        failed = np.flatnonzero(all_failed(groups["rewards"].reshape(-1), g))
        metrics = dict.fromkeys(
            ("failed_groups", "rescued_groups", "replaced_samples", "perturbed_correct"), 0.0
        )
        metrics["failed_groups"] = float(len(failed))
        metrics["perturbed_samples"] = 0.0
        if len(failed) == 0:
            return {f"lope/{k}": v for k, v in metrics.items()}
        for f in SAMPLE_FIELDS:  # writable copies (arrays from device buffers are read-only)
            groups[f] = np.array(groups[f])
        rng = np.random.default_rng((self.seed, step, attempt))
        made = [
            self.perturb(groups["prompt_tokens"][i, 0], groups["prompt_mask"][i, 0], rng)
            for i in failed
        ]
        tokens = np.concatenate([t for t, _ in made])
        mask = np.concatenate([m for _, m in made])
        source = np.repeat(failed, s.num_perturbed)  # the original prompt of each perturbed one
        real = len(source)
        m = self.prompt_multiple
        padded = np.resize(np.arange(real), bucket_size(real, m, -(-2 * real // m) * m))
        out = rollout(jnp.asarray(tokens[padded]), jnp.asarray(mask[padded]), _SALT + attempt)
        r = s.rollouts_per_perturbed
        keep = slice(0, real * r)  # the padded prompts' samples come last
        completion_tokens = np.asarray(out.completion_tokens)[keep]
        completion_mask = np.asarray(out.completion_mask)[keep]
        answers = {k: np.asarray(prompts[k])[source] for k in ("answer", "answer_len")}
        rewards, _ = score_rollout(
            self.task,
            self.tokenizer,
            {"prompt_tokens": tokens, "prompt_mask": mask, **answers},
            completion_tokens,
            completion_mask,
            r,
            self.scorer,
        )
        metrics["perturbed_correct"] = float((np.asarray(rewards) > 0).sum())
        metrics["perturbed_samples"] = float(len(rewards))
        perturbed = {
            "prompt_tokens": np.repeat(tokens, r, axis=0),
            "prompt_mask": np.repeat(mask, r, axis=0),
            "completion_tokens": completion_tokens,
            "completion_mask": completion_mask,
            "rollout_logprobs": np.asarray(out.sampling_logprobs)[keep],
            "rewards": np.asarray(rewards, groups["rewards"].dtype),
        }
        per_prompt = s.num_perturbed * r
        replaced_rows = []
        for k, i in enumerate(failed):
            mine = {f: v[k * per_prompt : (k + 1) * per_prompt] for f, v in perturbed.items()}
            merged = merge({f: groups[f][i] for f in SAMPLE_FIELDS}, mine, rng)
            for f in SAMPLE_FIELDS:
                groups[f][i] = merged.rows[f]
            replaced_rows += [(i, j) for j in np.flatnonzero(merged.replaced)]
        if replaced_rows:
            who = tuple(np.asarray(replaced_rows).T)
            rows = {f: groups[f][who] for f in SAMPLE_FIELDS}
            fresh = rescore(logprobs, rows, n * g)
            groups["rollout_logprobs"][who] = fresh.astype(groups["rollout_logprobs"].dtype)
        metrics["replaced_samples"] = float(len(replaced_rows))
        metrics["rescued_groups"] = float(len({i for i, _ in replaced_rows}))
        return {f"lope/{k}": v for k, v in metrics.items()}
