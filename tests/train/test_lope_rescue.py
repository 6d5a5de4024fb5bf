"""LoPE in the driver: all-failed groups get correct completions of Lorem-Ipsum-perturbed
prompts, trained under the original prompt."""

import numpy as np
import pytest

from rljax.data.samplers.lope import LOREM_WORDS, LoPESettings
from rljax.models.tokenizer import ByteTokenizer
from rljax.rollout.sampler import Rollout
from rljax.train.collector import GroupCollector
from rljax.train.draws import RolloutDraw, WithRescue
from rljax.train.lope import LoPERescue

TOKENIZER = ByteTokenizer()
G, P, P_LOPE = 4, 4, 40
BOS = TOKENIZER.bos_id


class EchoTask:
    def reward(self, completion: str, answer: str) -> float:
        return float(completion == answer)


def prompt_batch(n):
    """n prompts "<bos>1+1" whose answer is "a"."""
    tokens = np.tile(np.array([BOS, 49, 43, 49], np.int32), (n, 1))
    return {
        "prompt_tokens": tokens,
        "prompt_mask": np.ones((n, P), bool),
        "answer": np.tile(np.frombuffer(b"a\0", np.uint8), (n, 1)),
        "answer_len": np.ones(n, np.int32),
        "index": np.arange(n, dtype=np.int64),
    }


def rollout_of(samples, correct):
    """A sampler answering "a" where correct(prompt row, sample) else "b"."""
    seen = []

    def run(tokens, mask, attempt=0):
        seen.append((np.asarray(tokens), np.asarray(mask), attempt))
        n = len(tokens) * samples
        rows = [(i, j) for i in range(len(tokens)) for j in range(samples)]
        comp = np.array([[97 if correct(i, j) else 98] for i, j in rows], np.int32)
        return Rollout(
            prompt_tokens=np.repeat(np.asarray(tokens), samples, 0),
            prompt_mask=np.repeat(np.asarray(mask), samples, 0),
            completion_tokens=comp,
            completion_mask=np.ones((n, 1), bool),
            sampling_logprobs=np.full((n, 1), -0.5, np.float32),
            policy_logprobs=np.full((n, 1), -0.5, np.float32),
            group_id=np.arange(n) // samples,
        )

    return run, seen


def rescored(prompt_tokens, prompt_mask, completion_tokens, completion_mask):
    """A policy whose log-prob is -(prompt length); tells which prompt a row was scored under."""
    return np.where(completion_mask, -np.asarray(prompt_mask).sum(1, keepdims=True), 0.0)


def collect_rescued(main, lope, perturbed, step):
    """One step of a GroupCollector whose draws LoPE rescues (stateless fakes)."""
    stateless = lambda run: lambda state, *args: run(*args)  # noqa: E731
    draw = RolloutDraw(iter([prompt_batch(3)]), stateless(main), EchoTask(), TOKENIZER, G)
    draw = WithRescue(draw, lope, stateless(perturbed), stateless(rescored))
    collection = GroupCollector(draw, G).collect(None, step)
    return collection.fresh[0].to_batch(), collection.metrics


def run_lope(settings, solved_prompts):
    main, _ = rollout_of(G, lambda i, j: i in solved_prompts and j == 0)
    perturbed, seen = rollout_of(settings.rollouts_per_perturbed, lambda i, j: j == 0)
    lope = LoPERescue(settings, EchoTask(), TOKENIZER, P_LOPE, seed=0)
    batch, metrics = collect_rescued(main, lope, perturbed, step=5)
    return batch, metrics, seen


def test_failed_groups_get_up_to_g_minus_1_correct_completions_under_the_original_prompt():
    settings = LoPESettings(num_perturbed=3, rollouts_per_perturbed=2, min_words=2, max_words=4)
    batch, metrics, seen = run_lope(settings, solved_prompts={1})
    rewards = np.asarray(batch.rewards).reshape(3, G)
    # Group 1 was informative and is untouched; groups 0 and 2 failed, and 3 correct perturbed
    # completions each replace G - 1 = 3 failures, keeping one failure as the contrast.
    np.testing.assert_array_equal(rewards[1], [1, 0, 0, 0])
    np.testing.assert_array_equal(np.sort(rewards[[0, 2]], axis=1), [[0, 1, 1, 1]] * 2)
    np.testing.assert_array_equal(
        np.asarray(batch.prompt_tokens), prompt_batch(3)["prompt_tokens"].repeat(G, 0)
    )
    # Replaced rows were rescored under the original 4-token prompt; the rest keep the sampler's.
    logprobs = np.asarray(batch.rollout_logprobs)[:, 0].reshape(3, G)
    want = np.full((3, G), -0.5)
    want[[0, 2]] = np.where(rewards[[0, 2]] > 0, -4.0, -0.5)
    np.testing.assert_array_equal(logprobs, want)
    assert metrics["lope/failed_groups"] == 2 and metrics["lope/rescued_groups"] == 2
    assert metrics["lope/replaced_samples"] == 6
    assert metrics["lope/perturbed_correct"] == 6 and metrics["lope/perturbed_samples"] == 12
    # One call with the 2 x 3 perturbed prompts, padded to 8 rows, salted apart from the step.
    ((tokens, mask, attempt),) = seen
    assert tokens.shape == (8, P_LOPE) and attempt == 1 << 16
    for row, keep in zip(tokens[:6], mask[:6]):
        text = TOKENIZER.decode(row[keep][1:])
        assert row[keep][0] == BOS and text.endswith("\n\n1+1"), text
        words = text[: -len("\n\n1+1")].replace(".", "").lower().split()
        assert 2 <= len(words) <= 4 and set(words) <= set(LOREM_WORDS)


def test_without_enough_room_the_prefix_keeps_its_last_tokens():
    settings = LoPESettings(num_perturbed=1, rollouts_per_perturbed=2, min_words=50, max_words=50)
    lope = LoPERescue(settings, EchoTask(), TOKENIZER, 12, seed=0)
    tokens, mask = lope.perturb(
        prompt_batch(1)["prompt_tokens"][0], np.ones(P, bool), np.random.default_rng(0)
    )
    assert mask.all() and tokens[0, 0] == BOS
    assert TOKENIZER.decode(tokens[0, 1:]).endswith(".\n\n1+1")
    with pytest.raises(ValueError, match="lope.max_prompt_len"):
        LoPERescue(settings, EchoTask(), TOKENIZER, 3, seed=0).perturb(
            prompt_batch(1)["prompt_tokens"][0], np.ones(P, bool), np.random.default_rng(0)
        )


def test_nothing_happens_without_failed_groups_or_correct_perturbations():
    settings = LoPESettings(num_perturbed=2, rollouts_per_perturbed=2, min_words=1, max_words=2)
    batch, metrics, seen = run_lope(settings, solved_prompts={0, 1, 2})
    assert seen == [] and metrics["lope/failed_groups"] == 0
    lope = LoPERescue(settings, EchoTask(), TOKENIZER, P_LOPE, seed=0)
    main, _ = rollout_of(G, lambda i, j: False)
    never, _ = rollout_of(2, lambda i, j: False)
    batch, metrics = collect_rescued(main, lope, never, step=0)
    assert metrics["lope/rescued_groups"] == 0 and np.asarray(batch.rewards).sum() == 0
