"""Diffusion-LM RL algorithms: which likelihood estimator feeds which objective.

A masked-diffusion LM's log pi(o | q) is an estimate, so a diffusion algorithm is a pairing of
an estimator (`rljax.diffusion.likelihood`) with an objective (`rljax.diffusion.objectives`),
plus the transforms that turn rewards into advantages. `rljax.diffusion.steps` runs them:

  name         estimator (theta, theta_old, ref on the same masks)  objective
  diffu_grpo   `one_pass_estimate` (d1)                              `diffu_grpo_loss`
  rldf         `rldf_states` / `rldf_logprobs` (replayed states)     `rldf_loss`
  wd1          `one_pass_estimate`, summed over the completion       `wd1_loss`
  rspo         `elbo_fixed_count` (LLaDA's lower-variance ELBO)      `rspo_loss`
  daca         `stratified_estimate` (DACA's stratified masking)     `diffu_grpo_loss` on
                                                                     `daca_advantages`

Every preset starts from GRPO's group-normalised advantages (`group_advantages`, the
sequence advantage on each completion token through the first EOS); `daca` then scales each
token's advantage by its Denoising Progress Score (`daca_weights`, from the rollout's step map:
the sampler records no intermediate predictions, and `daca_weights` takes the step of
unmasking as the stable step). The estimator pairings follow the papers' code where it exists
(d1 and wd1: one pass; RLDF: its states) and otherwise the estimator the paper names: RSPO
regresses onto an ELBO log-ratio, for which LLaDA's fixed-count ELBO is the unbiased,
lower-variance choice; DACA-GRPO's abstract introduces its stratified likelihood.

The presets share one set of settings (`DiffusionSettings`), so a recipe switches algorithms
with `--config.algorithm.name=...` alone; each field says which presets read it.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import chex
import jax.numpy as jnp

from rljax.advantages.group import group_advantages
from rljax.core.batch import Batch
from rljax.core.transform import Context, Metrics, Transform, chain, stateless
from rljax.diffusion.objectives import daca_advantages, daca_weights

# batch.extras key of the rollout's step map [B, T] (`DiffusionRollout.step_map`).
STEP_MAP_KEY = "step_map"


@dataclasses.dataclass(frozen=True)
class DiffusionSettings:
    """The knobs of the diffusion presets (the `algorithm.*` config keys).

    Attributes:
      clip_eps: PPO clip range (diffu_grpo, rldf, daca), in [0, 1).
      beta: k3 KL coefficient to the reference policy, the SFT policy (diffu_grpo, rldf,
        daca); 0 runs no reference pass.
      p_mask_prompt: probability of masking each prompt token in the one-pass estimate
        (diffu_grpo, wd1; d1 reports 0.15, wd1's config uses 0.3).
      rldf_k: RLDF states (timesteps) per sample.
      rldf_temperature: softmax temperature of RLDF's surprisal-weighted timestep draw.
      rldf_threshold: RLDF's clipped clean state keeps masked tokens with rollout probability
        >= threshold (plus the step's own tokens); 0 keeps every masked token.
      num_strata: K, forward passes of DACA's stratified estimate.
      elbo_samples: masks per ELBO estimate (rspo).
      rspo_beta: RSPO's scale of the log-ratio: the loss pulls rspo_beta (ELBO_theta -
        ELBO_ref) towards the advantage (choice: 1, a log-ratio target of +-1 nat per unit of
        advantage; the paper's value is not public).
    """

    clip_eps: float = 0.2
    beta: float = 0.04
    p_mask_prompt: float = 0.15
    rldf_k: int = 2
    rldf_temperature: float = 1.0
    rldf_threshold: float = 0.0
    num_strata: int = 2
    elbo_samples: int = 1
    rspo_beta: float = 1.0

    def __post_init__(self):
        checks = {
            "clip_eps": 0.0 <= self.clip_eps < 1.0,
            "beta": self.beta >= 0.0,
            "p_mask_prompt": 0.0 <= self.p_mask_prompt <= 1.0,
            "rldf_k": self.rldf_k >= 1,
            "rldf_temperature": self.rldf_temperature > 0.0,
            "rldf_threshold": 0.0 <= self.rldf_threshold <= 1.0,
            "num_strata": self.num_strata >= 1,
            "elbo_samples": self.elbo_samples >= 1,
            "rspo_beta": self.rspo_beta > 0.0,
        }
        ranges = {
            "clip_eps": "in [0, 1)",
            "beta": ">= 0",
            "p_mask_prompt": "in [0, 1]",
            "rldf_k": ">= 1",
            "rldf_temperature": "> 0",
            "rldf_threshold": "in [0, 1] (0: off)",
            "num_strata": ">= 1",
            "elbo_samples": ">= 1",
            "rspo_beta": "> 0",
        }
        for key, ok in checks.items():
            if not ok:
                raise ValueError(f"algorithm.{key}={getattr(self, key)} must be {ranges[key]}")


class DiffusionAlgorithm(NamedTuple):
    """A diffusion-LM RL algorithm: the estimator/objective pairing, settings and transforms.

    Attributes:
      name: the pairing (a key of `DIFFUSION_ALGORITHMS`).
      group_size: G, samples per prompt.
      settings: the presets' knobs.
      transform: rewards -> `batch.advantages` [B, T] (and anything else the objective reads);
        its state lives in `TrainState.transform_state`.
      needs_reference: the update reads the reference policy's estimates.
    """

    name: str
    group_size: int
    settings: DiffusionSettings
    transform: Transform
    needs_reference: bool


def daca_progress(num_steps: int) -> Transform:
    """Scales token advantages by DACA-GRPO's Denoising Progress Scores (arXiv 2605.16342).

    A_t <- w_t A_t with w = `daca_weights(step_map, completion_mask, num_steps)` (mean 1 over
    each sequence's valid tokens, more for tokens unmasked early). Reads
    `extras["step_map"]` [B, T], the rollout's step of unmasking.

    Args:
      num_steps: S, the sampler's forward passes per rollout.
    """

    def fn(batch: Batch, ctx: Context) -> tuple[Batch, Metrics]:
        del ctx
        step_map = batch.extras[STEP_MAP_KEY].astype(jnp.int32)
        chex.assert_equal_shape([step_map, batch.completion_mask])
        weights = daca_weights(step_map, batch.completion_mask, num_steps)
        advantages = daca_advantages(batch.advantages[:, 0], weights)
        valid = batch.completion_mask
        spread = jnp.where(valid, jnp.abs(weights - 1.0), 0.0).sum() / jnp.maximum(valid.sum(), 1)
        return batch.replace(advantages=advantages), {"daca/weight_spread": spread}

    return stateless(fn)


def _preset(
    name: str, group_size: int, settings: DiffusionSettings, extra: tuple[Transform, ...] = ()
) -> DiffusionAlgorithm:
    reference = name == "rspo" or (name != "wd1" and settings.beta > 0)
    transform = chain(group_advantages(group_size), *extra)
    return DiffusionAlgorithm(name, group_size, settings, transform, reference)


def diffu_grpo(
    group_size: int, settings: DiffusionSettings = DiffusionSettings()
) -> DiffusionAlgorithm:
    """d1's diffu-GRPO (arXiv 2504.12216): one-pass estimates, PPO clip, k3 KL to ref."""
    return _preset("diffu_grpo", group_size, settings)


def rldf(group_size: int, settings: DiffusionSettings = DiffusionSettings()) -> DiffusionAlgorithm:
    """RLDF (arXiv 2605.25638): the clipped surrogate on k replayed noisy states per sample."""
    return _preset("rldf", group_size, settings)


def wd1(group_size: int, settings: DiffusionSettings = DiffusionSettings()) -> DiffusionAlgorithm:
    """wd1 (arXiv 2507.08838): group-softmax weighted likelihood of one-pass sequence
    estimates; no ratio, no reference."""
    return _preset("wd1", group_size, settings)


def rspo(group_size: int, settings: DiffusionSettings = DiffusionSettings()) -> DiffusionAlgorithm:
    """RSPO (arXiv 2605.10218, interpretation): regress rspo_beta x the ELBO log-ratio to ref
    onto the advantage."""
    return _preset("rspo", group_size, settings)


def daca(
    group_size: int, num_steps: int, settings: DiffusionSettings = DiffusionSettings()
) -> DiffusionAlgorithm:
    """DACA-GRPO (arXiv 2605.16342, interpretation): diffu-GRPO's loss on stratified estimates
    with progress-weighted token advantages; `num_steps` is the sampler's S (from the run)."""
    return _preset("daca", group_size, settings, (daca_progress(num_steps),))


# Every diffusion preset by `algorithm.name` (with `model.kind = "diffusion"`).
DIFFUSION_ALGORITHMS = {
    "diffu_grpo": diffu_grpo,
    "rldf": rldf,
    "wd1": wd1,
    "rspo": rspo,
    "daca": daca,
}
