"""On-policy distillation's teacher: a frozen policy that scores the student's sampled tokens.

The teacher is another run's checkpoint (`teacher.run_dir`: its `config.json` says how to
build it, so it may be larger or smaller than the student, or of another model family, as long
as the tokenizer is the same). It is restored once, placed like the reference policy, and never
trained. Each drawn batch gets `extras["teacher_logprobs"]` [B, T]: log pi_teacher of every
sampled token given the same context, which a transform turns into per-token advantages
(`rljax.advantages.distillation`); with `teacher.top_k` = k > 0 also the teacher's k
likeliest tokens at every position and their log-probs, which GKD's divergence reads
(`rljax.objectives.gkd`). The student samples, the teacher grades: the student learns
on its own distribution (on-policy), with dense per-token feedback.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from ml_collections import ConfigDict

from rljax.models.tokenizer import Tokenizer
from rljax.train.collector import Draw, Drawn
from rljax.train.evaluation import restore_policy
from rljax.train.logprobs import policy_states, token_stats, token_top_k
from rljax.train.run_dir import stored_config
from rljax.train.staleness import Policies
from rljax.train.timing import add_time

TEACHER_LOGPROBS = "teacher_logprobs"
TEACHER_TOPK_IDS = "teacher_topk_ids"
TEACHER_TOPK_LOGPROBS = "teacher_topk_logprobs"


class Teacher(NamedTuple):
    """A frozen policy: its graph, parameters and the checkpoint step they came from."""

    graphdef: nnx.GraphDef
    params: nnx.State
    step: int


def load_teacher(config: ConfigDict, tokenizer: Tokenizer) -> Teacher:
    """The newest checkpoint of `teacher.run_dir` (or the one at `teacher.step`), built from
    that run's stored `config.json`.

    Raises:
      FileNotFoundError: no run directory, no `config.json` or no checkpoint there (named).
      ValueError: the teacher's tokenizer differs from the student's (its vocabulary size or
        special ids), its config.json does not validate, or its run is not a causal LM.
    """
    section = config.teacher
    try:
        teacher_config = stored_config(section.run_dir)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"teacher.run_dir={section.run_dir!r} has no config.json: point it at the run "
            "directory of a trained policy (what launchers.train wrote)"
        ) from None
    run_dir = teacher_config.run_dir
    step = None if section.step < 0 else section.step
    step, teacher_tokenizer, graphdef, params = restore_policy(teacher_config, step)
    mine = (tokenizer.vocab_size, tokenizer.eos_id, tokenizer.pad_id)
    theirs = (teacher_tokenizer.vocab_size, teacher_tokenizer.eos_id, teacher_tokenizer.pad_id)
    if mine != theirs:
        raise ValueError(
            f"the teacher in {run_dir} has another tokenizer (vocab, eos, pad = {theirs}) than "
            f"the student ({mine}): distillation scores the student's tokens with the teacher"
        )
    return Teacher(graphdef, params, step)


def teacher_scorer(
    teacher: Teacher, vocab_chunk: int = 8192, top_k: int = 0
) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """`rows -> {field: array}`: the teacher's log-probs of the completion tokens
    ("teacher_logprobs" [B, T] float32) and, with `top_k` > 0, its `top_k` likeliest tokens at
    each completion position ("teacher_topk_ids" [B, T, k] int32, "teacher_topk_logprobs"
    [B, T, k] float32, for GKD), all 0 off `completion_mask`. One forward pass over prompt +
    completion that attends to the environment tokens of multi-turn rows (`env_mask`) as the
    student's passes do."""

    @jax.jit
    def score(params, prompt_tokens, prompt_mask, completion_tokens, completion_mask, context):
        states = policy_states(
            teacher.graphdef, params, prompt_tokens, prompt_mask, completion_tokens, context
        )
        hidden = states.completion_hidden
        out = token_stats(hidden, states.head, completion_tokens, vocab_chunk)
        scores = {TEACHER_LOGPROBS: jnp.where(completion_mask, out.logprobs, 0.0)}
        if top_k:
            logprobs, ids = token_top_k(hidden, states.head, top_k, vocab_chunk)
            valid = completion_mask[..., None]
            scores[TEACHER_TOPK_LOGPROBS] = jnp.where(valid, logprobs, 0.0)
            scores[TEACHER_TOPK_IDS] = jnp.where(valid, ids, 0)
        return scores

    def run(rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        mask = np.asarray(rows["completion_mask"], bool)
        context = mask | (np.asarray(rows["env_mask"]) > 0) if "env_mask" in rows else mask
        scores = score(
            teacher.params,
            jnp.asarray(rows["prompt_tokens"]),
            jnp.asarray(rows["prompt_mask"], bool),
            jnp.asarray(rows["completion_tokens"]),
            jnp.asarray(mask),
            jnp.asarray(context),
        )
        return {name: np.asarray(value) for name, value in scores.items()}

    return run


class WithTeacher:
    """A draw whose rows also carry the teacher's scores of their sampled tokens
    (`extras["teacher_logprobs"]`, and the top-k fields with `teacher.top_k`);
    "time/teacher_s" is the scoring's time."""

    def __init__(
        self, inner: Draw, score: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
    ):
        self.inner = inner
        self.score = score

    def __call__(self, policies: Policies, step: int, attempt: int) -> Drawn:
        drawn = self.inner(policies, step, attempt)
        start = time.perf_counter()
        scores = self.score(drawn.rows.rows)
        metrics: dict[str, Any] = dict(drawn.metrics)
        add_time(metrics, "time/teacher_s", time.perf_counter() - start)
        return Drawn(drawn.prompts, drawn.rows.with_rows(**scores), metrics)

    def step_metrics(self) -> dict[str, float]:
        return self.inner.step_metrics()
