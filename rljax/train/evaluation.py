"""Sampled evaluation of a policy: pass@k, avg@n and greedy accuracy on a task's split.

Training logs greedy accuracy (`greedy_eval`); what RL changes is often the
spread of the sampled answers, which pass@k at several k shows. Each problem gets n samples
at the evaluation temperature (top_k/top_p from `rollout.*`) and one greedy decode; pass@k
uses the unbiased estimator of Chen et al. 2021. `restore_policy` loads a training run's
policy from its checkpoints with the same config, so model, task and prompt format match
(`restore_checkpoint`: the whole train state, e.g. LoRA adapters apart from their base).
"""

from __future__ import annotations

import collections
import functools
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, PartitionSpec
from ml_collections import ConfigDict
from tqdm.auto import tqdm

from rljax.core.state import TrainState
from rljax.data.tasks import Task
from rljax.models.config import TransformerConfig
from rljax.models.lora import merged_params
from rljax.models.tokenizer import Tokenizer
from rljax.parallel.distributed import fetch, to_global
from rljax.parallel.rules import mesh_shardings, shard_params
from rljax.rollout.sampling import SamplingParams
from rljax.train.builders import (
    build_algorithm,
    build_decoder,
    build_mesh,
    build_optimizer,
    build_policy,
    build_scorer,
    build_train_state,
)
from rljax.train.checkpoint import Checkpointer
from rljax.train.prompts import Prompts
from rljax.train.scoring import Scorer, decode_completions, eval_metrics, score_rollout


def pass_at_k(correct: np.ndarray, n: int, k: int) -> np.ndarray:
    """Unbiased pass@k per problem: 1 - C(n - c, k) / C(n, k), c correct out of n samples.

    "Evaluating Large Language Models Trained on Code" (Chen et al. 2021, arXiv 2107.03374):
    the probability that a k-subset of the n samples, drawn without replacement, holds a
    correct one. The ratio is computed as the product prod_{j<k} (n - c - j) / (n - j) in
    float64, which stays exact where the binomials themselves would overflow.

    Args:
      correct: [P] integer counts c of correct samples, 0 <= c <= n.
      n: samples per problem.
      k: subset size, 1 <= k <= n.

    Returns:
      [P] float64 pass@k values.

    Raises:
      ValueError: k is not in [1, n], or a count is outside [0, n].
    """
    correct = np.asarray(correct)
    if not 1 <= k <= n:
        raise ValueError(f"k={k} must be in [1, n={n}]: pass@k needs at least k samples")
    if correct.size and (correct.min() < 0 or correct.max() > n):
        raise ValueError(
            f"correct counts must be in [0, n={n}]; got {correct.min()}..{correct.max()}"
        )
    wrong = (n - correct).astype(np.float64)
    j = np.arange(k, dtype=np.float64)
    fail = np.prod(np.maximum(wrong[:, None] - j, 0.0) / (n - j), axis=1)  # 0 once n - c < k
    return 1.0 - fail


class Restored(NamedTuple):
    """A training run's checkpoint as `restore_checkpoint` gives it."""

    step: int
    tokenizer: Tokenizer
    model_config: TransformerConfig
    graphdef: nnx.GraphDef
    state: TrainState  # placed on the run's mesh


def restore_checkpoint(config: ConfigDict, step: int | None = None) -> Restored:
    """A training run's train state, from `run_dir/checkpoints`, placed on the run's mesh.

    Args:
      config: the training run's config (validated: `rljax.config.validate_config`).
      step: the checkpoint's step; None the newest.

    Raises:
      FileNotFoundError: no checkpoint directory, no complete checkpoint, or none at `step`;
        the message names the directory.
      ValueError: a step < 1, or a checkpoint that does not fit the config's train state.
    """
    if step is not None and step < 1:
        raise ValueError(f"step={step} must be >= 1 (None: the newest checkpoint)")
    _check_causal(config)
    directory = os.path.join(os.path.abspath(config.run_dir), "checkpoints")
    missing = f"no checkpoint in {directory}; train with this config and run_dir first"
    if not os.path.isdir(directory):  # before building anything: fails fast
        raise FileNotFoundError(missing)
    tokenizer, model_config, graphdef, params = build_policy(config)
    mesh = build_mesh(config)
    checkpointer = Checkpointer(
        directory,
        config.train.max_checkpoints,
        async_save=False,
        allow_unverified=config.train.allow_unverified_checkpoint,
    )
    try:
        step = checkpointer.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(missing)
        algorithm = build_algorithm(config, model_config.vocab_size)
        like, _ = build_train_state(
            config, model_config, params, algorithm, build_optimizer(config.train)
        )
        like = jax.device_put(like, mesh_shardings(like, mesh))
        state, _ = checkpointer.restore(step, like)
    finally:
        checkpointer.close()
    return Restored(step, tokenizer, model_config, graphdef, state)


def _check_causal(config: ConfigDict) -> None:
    if config.model.kind != "causal":
        raise ValueError(
            f"model.kind={config.model.kind!r}: restoring and sampling a policy here supports "
            "causal LMs only; a diffusion run's greedy evaluations are in its metrics.jsonl"
        )


def restore_policy(
    config: ConfigDict, step: int | None = None
) -> tuple[int, Tokenizer, nnx.GraphDef, nnx.State]:
    """A training run's policy, from `run_dir/checkpoints`, placed on the run's mesh.

    Args:
      config: the training run's config (validated: `rljax.config.validate_config`).
      step: the checkpoint's step; None the newest; 0 the model as `model.*` builds it
        (before any training, without the SFT warm start), needing no checkpoint.

    Returns:
      (step, tokenizer, graphdef, params), LoRA adapters merged into the base.

    Raises:
      FileNotFoundError: no checkpoint directory, no complete checkpoint, or none at `step`;
        the message names the directory.
      ValueError: a negative step, or a checkpoint that does not fit the config's train state.
    """
    if step is not None and step < 0:
        raise ValueError(f"step={step} must be >= 0 (0: the untrained model; None: the newest)")
    if step != 0:
        try:
            restored = restore_checkpoint(config, step)
        except FileNotFoundError as err:
            raise FileNotFoundError(
                f"{err}, or evaluate the untrained model with step 0 (--step=0)"
            ) from None
        return restored.step, restored.tokenizer, restored.graphdef, merged_params(restored.state)
    _check_causal(config)
    tokenizer, _, graphdef, params = build_policy(config)
    return 0, tokenizer, graphdef, shard_params(params, build_mesh(config))


def eval_batches(
    dataset: Any, num_problems: int, batch_size: int
) -> Iterator[tuple[dict[str, np.ndarray], int]]:
    """(batch, real rows) over the first `num_problems` problems of a prompt dataset.

    The last batch is padded with copies of its last problem (their results are dropped), so
    every batch has the compiled shape and every problem is evaluated once.
    """
    for start in range(0, num_problems, batch_size):
        rows = [dataset[i] for i in range(start, min(start + batch_size, num_problems))]
        real = len(rows)
        rows += [rows[-1]] * (batch_size - real)
        yield {key: np.stack([row[key] for row in rows]) for key in rows[0]}, real


class Scored(NamedTuple):
    """One evaluation batch's n decodes per real problem, scored."""

    rewards: np.ndarray  # [real, n] float64
    tokens: np.ndarray  # [real * n, T]
    mask: np.ndarray  # [real * n, T]
    failures: dict[str, int]


def decode_and_score(
    decode: Callable[..., Any],
    batch: dict[str, np.ndarray],
    real: int,
    n: int,
    sampling: SamplingParams,
    key: jax.Array,
    task: Task,
    tokenizer: Tokenizer,
    scorer: Scorer,
    mesh: Mesh | None = None,
) -> Scored:
    """n completions of each problem of `batch` (`decode`: from `build_decoder`), each
    scored by `task.reward` through the contained `scorer`.

    With `mesh` (a multi-process run) every process feeds the whole, identical batch as a
    replicated global array and reads all outputs back, so all report the same numbers.
    """
    tokens, mask = batch["prompt_tokens"], batch["prompt_mask"]
    if mesh is not None:
        tokens, mask = to_global((tokens, mask), mesh, PartitionSpec())
    out = decode(jnp.asarray(tokens), jnp.asarray(mask), key, n_samples=n, sampling=sampling)
    out_tokens = fetch(out.completion_tokens)[: real * n]
    out_mask = fetch(out.completion_mask)[: real * n]
    real_batch = {name: value[:real] for name, value in batch.items()}
    scores, failures = score_rollout(
        task, tokenizer, real_batch, out_tokens, out_mask, n, scorer, grouped=False
    )
    rewards = np.asarray(scores, np.float64).reshape(real, n)
    return Scored(rewards, out_tokens, out_mask, failures)


def greedy_eval(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    task: Task,
    prompts: Prompts,
    config: ConfigDict,
    mesh: Mesh | None = None,
) -> dict[str, float]:
    """Greedy accuracy and mean reward on the first `task.eval_size` held-out problems.

    The evaluation a training run logs every `train.eval_every` steps, on the same path as
    `sample_eval`'s greedy pass: batches of `train.prompts_per_step` problems, each answer
    scored by `task.reward` through the run's contained scorer (`reward.*`, the pool training
    uses), so a reward function that raises, exits, returns garbage or hangs scores 0 and is
    counted in `eval/reward_failures_*` instead of stopping the run. `mesh`: see
    `decode_and_score`.
    """
    size, tokenizer = config.task.eval_size, prompts.tokenizer
    dataset = prompts.dataset(
        task, "test", seed=None, num_examples=size, shard_index=0, shard_count=1
    )
    decode = functools.partial(build_decoder(graphdef, config, tokenizer), params)
    scorer, greedy, key = build_scorer(config), SamplingParams(greedy=True), jax.random.PRNGKey(0)
    rewards, failures = [], collections.Counter()
    for batch, real in eval_batches(dataset, size, min(size, config.train.prompts_per_step)):
        scored = decode_and_score(
            decode, batch, real, 1, greedy, key, task, tokenizer, scorer, mesh
        )
        rewards.append(scored.rewards[:, 0])
        failures.update(scored.failures)
    return eval_metrics(np.concatenate(rewards), failures)


class SampleEvalPlan(NamedTuple):
    """What a sampled evaluation runs (`sample_eval_plan`): its split's first `num_problems`
    problems, `n_samples` samples each with `sampling` (seeded by `seed`), pass@k for `ks`."""

    split: str
    num_problems: int
    n_samples: int
    ks: list[int]
    sampling: SamplingParams
    seed: int

    def header(self) -> dict[str, Any]:
        """The report's settings: split, num_problems, n_samples, temperature, top_k, top_p,
        seed."""
        s = self.sampling
        return {
            "split": self.split,
            "num_problems": self.num_problems,
            "n_samples": self.n_samples,
            "temperature": float(s.temperature),
            "top_k": int(s.top_k),
            "top_p": float(s.top_p),
            "seed": int(self.seed),
        }

    def pass_at_k(self, correct: np.ndarray) -> dict[str, float]:
        """{str(k): mean over problems of pass@k} from each problem's count of correct samples."""
        return {str(k): float(pass_at_k(correct, self.n_samples, k).mean()) for k in self.ks}


def sample_eval_plan(
    config: ConfigDict,
    n_samples: int,
    ks: Sequence[int],
    temperature: float | None,
    split: str,
    num_problems: int | None,
    seed: int | None,
) -> SampleEvalPlan:
    """A sampled evaluation's settings, defaults from the config (`rollout.temperature`,
    `top_k`, `top_p`, `task.eval_size`, `seed`).

    Raises:
      ValueError: n_samples < 1 or a k outside [1, n].
    """
    r = config.rollout
    if n_samples < 1:
        raise ValueError(f"n_samples={n_samples} must be >= 1")
    ks = sorted(set(ks))
    for k in ks:
        pass_at_k(np.zeros(0, np.int64), n_samples, k)  # checks 1 <= k <= n
    temperature = r.temperature if temperature is None else temperature
    return SampleEvalPlan(
        split,
        config.task.eval_size if num_problems is None else num_problems,
        n_samples,
        ks,
        SamplingParams(temperature=temperature, top_k=r.top_k, top_p=r.top_p),
        config.seed if seed is None else seed,
    )


def sample_eval(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    task: Task,
    prompts: Prompts,
    config: ConfigDict,
    n_samples: int,
    ks: Sequence[int],
    *,
    temperature: float | None = None,
    split: str = "test",
    num_problems: int | None = None,
    seed: int | None = None,
) -> dict[str, Any]:
    """pass@k, avg@n, greedy accuracy and lengths of a policy on the first problems of a split.

    Problems go in batches of `train.prompts_per_step` (the last one padded with copies of its
    last problem, whose results are dropped, so every batch has the compiled shape). A sample
    is correct when its reward is >= 1, as in `greedy_eval`; each answer is scored on its own
    by `task.reward` through the config's scorer (`reward.*`; a task's `group_rewards` is a
    training signal, e.g. CRPS credit, not a score of one answer).
    Interpretation: the samples use plain temperature/top-k/top-p sampling with the given
    params; the training sampler's CUTS rows and quantized weights (`rollout.cuts_top_k`,
    `rollout.weight_format`) are exploration and speed devices of training, not the policy.

    Args:
      graphdef, params: the policy.
      task: the task; `prompts` turns its problems into model input.
      config: the run's config (`rollout.*`, `train.prompts_per_step`, `task.eval_size`).
      n_samples: n >= 1 samples per problem.
      ks: the k of pass@k, each in [1, n].
      temperature: sampling temperature (> 0); None takes `rollout.temperature`.
      split: the task split.
      num_problems: the split's first this many problems; None takes `task.eval_size`.
      seed: sampling key (batch b samples with fold_in(PRNGKey(seed), b)); None: `config.seed`.

    Returns:
      A JSON-ready dict: split, num_problems, n_samples, temperature, top_k, top_p, seed;
      "pass_at_k" {str(k): mean over problems of pass@k}; "avg_at_n" (accuracy over all
      samples), "mean_reward"; "greedy_accuracy", "greedy_reward"; "mean_completion_length"
      and "greedy_mean_completion_length" (tokens, EOS included); "reward_failures" (failed
      reward calls by kind); "problems": per problem {"index", "correct" (of n),
      "greedy_correct", "greedy_completion" (the text)}.

    Raises:
      ValueError: n_samples < 1, a k outside [1, n], or bad sampling settings or problem count.
    """
    plan = sample_eval_plan(config, n_samples, ks, temperature, split, num_problems, seed)
    num_problems, seed, sampling = plan.num_problems, plan.seed, plan.sampling
    dataset = prompts.dataset(
        task, split, seed=None, num_examples=num_problems, shard_index=0, shard_count=1
    )
    tokenizer, scorer = prompts.tokenizer, build_scorer(config)
    decode = functools.partial(build_decoder(graphdef, config, tokenizer), params)
    batch_size = min(num_problems, config.train.prompts_per_step)
    rewards: dict[str, list] = {"sampled": [], "greedy": []}  # [real, n] per batch
    lengths: dict[str, list] = {"sampled": [], "greedy": []}  # [real * n] per batch
    failures: collections.Counter = collections.Counter()
    indices, greedy_texts = [], []
    batches = tqdm(
        eval_batches(dataset, num_problems, batch_size),
        desc=f"eval {split}",
        total=-(-num_problems // batch_size),
        unit="batch",
        dynamic_ncols=True,
        disable=jax.process_index() != 0,
    )
    for b, (batch, real) in enumerate(batches):
        key = jax.random.fold_in(jax.random.PRNGKey(seed), b)
        for mode, n, how in (
            ("sampled", n_samples, sampling),
            ("greedy", 1, SamplingParams(greedy=True)),
        ):
            scored = decode_and_score(decode, batch, real, n, how, key, task, tokenizer, scorer)
            rewards[mode].append(scored.rewards)
            lengths[mode].append(scored.mask.sum(axis=1))
            failures.update(scored.failures)
            if mode == "greedy":
                greedy_texts += decode_completions(tokenizer, scored.tokens, scored.mask)
        indices += [int(i) for i in batch["index"][:real]]
    sampled_rewards, greedy_rewards = (np.concatenate(rewards[m]) for m in ("sampled", "greedy"))
    sampled_lengths, greedy_lengths = (np.concatenate(lengths[m]) for m in ("sampled", "greedy"))
    correct = (sampled_rewards >= 1.0).sum(axis=1)
    greedy_correct = greedy_rewards[:, 0] >= 1.0
    return {
        **plan.header(),
        "pass_at_k": plan.pass_at_k(correct),
        "avg_at_n": float((sampled_rewards >= 1.0).mean()),
        "mean_reward": float(sampled_rewards.mean()),
        "greedy_accuracy": float(greedy_correct.mean()),
        "greedy_reward": float(greedy_rewards.mean()),
        "mean_completion_length": float(sampled_lengths.mean()),
        "greedy_mean_completion_length": float(greedy_lengths.mean()),
        "reward_failures": {kind: int(count) for kind, count in sorted(failures.items())},
        "problems": [
            {"index": i, "correct": int(c), "greedy_correct": bool(g), "greedy_completion": t}
            for i, c, g, t in zip(indices, correct, greedy_correct, greedy_texts)
        ],
    }
