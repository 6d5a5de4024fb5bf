"""On-policy distillation's teacher: a frozen policy that scores the student's sampled tokens.

The teacher is another run's checkpoint (`teacher.run_dir`: its `config.json` says how to
build it, so it may be larger or smaller than the student, or of another model family, as long
as the tokenizer is the same). It is restored once, placed like the reference policy, and never
trained. Each drawn batch gets `extras["teacher_logprobs"]` [B, T]: log pi_teacher of every
sampled token given the same context, which a transform turns into per-token advantages
(`rljax.advantages.distillation`). The student samples, the teacher grades: the student learns
on its own distribution (on-policy), with dense per-token feedback.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from ml_collections import ConfigDict

from rljax.config import config_from_json, validate_config
from rljax.models.tokenizer import Tokenizer
from rljax.train.collector import Draw, Drawn
from rljax.train.evaluation import restore_policy
from rljax.train.logprobs import policy_states, token_stats
from rljax.train.staleness import Policies
from rljax.train.timing import add_time

TEACHER_LOGPROBS = "teacher_logprobs"


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
    run_dir = os.path.abspath(section.run_dir)
    path = os.path.join(run_dir, "config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"teacher.run_dir={section.run_dir!r} has no config.json: point it at the run "
            "directory of a trained policy (what launchers.train wrote)"
        )
    with open(path, encoding="utf-8") as f:
        teacher_config = validate_config(config_from_json(json.load(f)))
    teacher_config.run_dir = run_dir
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
    teacher: Teacher, vocab_chunk: int = 8192
) -> Callable[[dict[str, np.ndarray]], np.ndarray]:
    """`rows -> [B, T] float32`: the teacher's log-probs of the completion tokens (0 off
    `completion_mask`), from one forward pass over prompt + completion that attends to the
    environment tokens of multi-turn rows (`env_mask`) as the student's passes do."""

    @jax.jit
    def score(params, prompt_tokens, prompt_mask, completion_tokens, completion_mask, context):
        states = policy_states(
            teacher.graphdef, params, prompt_tokens, prompt_mask, completion_tokens, context
        )
        out = token_stats(states.completion_hidden, states.head, completion_tokens, vocab_chunk)
        return jnp.where(completion_mask, out.logprobs, 0.0)

    def run(rows: dict[str, np.ndarray]) -> np.ndarray:
        mask = np.asarray(rows["completion_mask"], bool)
        context = mask | (np.asarray(rows["env_mask"]) > 0) if "env_mask" in rows else mask
        logprobs = score(
            teacher.params,
            jnp.asarray(rows["prompt_tokens"]),
            jnp.asarray(rows["prompt_mask"], bool),
            jnp.asarray(rows["completion_tokens"]),
            jnp.asarray(mask),
            jnp.asarray(context),
        )
        return np.asarray(logprobs, np.float32)

    return run


class WithTeacher:
    """A draw whose rows also carry the teacher's log-probs of their sampled tokens
    (`extras["teacher_logprobs"]`); "time/teacher_s" is the scoring's time."""

    def __init__(self, inner: Draw, score: Callable[[dict[str, np.ndarray]], np.ndarray]):
        self.inner = inner
        self.score = score

    def __call__(self, policies: Policies, step: int, attempt: int) -> Drawn:
        drawn = self.inner(policies, step, attempt)
        start = time.perf_counter()
        teacher = self.score(drawn.rows.rows)
        metrics: dict[str, Any] = dict(drawn.metrics)
        add_time(metrics, "time/teacher_s", time.perf_counter() - start)
        return Drawn(drawn.prompts, drawn.rows.with_rows(**{TEACHER_LOGPROBS: teacher}), metrics)

    def step_metrics(self) -> dict[str, float]:
        return self.inner.step_metrics()
