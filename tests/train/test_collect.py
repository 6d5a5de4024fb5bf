"""The host side of an iteration: scoring, DAPO's refill of all-equal groups, ReMax's baseline
(the draw hooks and `GroupCollector`)."""

import time

import numpy as np
import pytest

from configs.grpo_addition import get_config
from rljax.models.tokenizer import ByteTokenizer
from rljax.rewards import score_completions
from rljax.rewards.pool import close_shared_pools
from rljax.rollout.sampler import Rollout
from rljax.train.builders import build_scorer
from rljax.train.collector import GroupCollector
from rljax.train.draws import RolloutDraw, WithGreedyBaseline
from rljax.train.scoring import informative_groups

TOKENIZER = ByteTokenizer()
G = 2


class EchoTask:
    """Reward 1 when the completion equals the answer."""

    def reward(self, completion: str, answer: str) -> float:
        return float(completion == answer)


def collect_batch(
    rollout,
    data,
    task,
    tokenizer,
    g,
    max_refill_rounds=0,
    greedy=None,
    scorer=score_completions,
    token_level=False,
):
    """One step of a GroupCollector over a stateless fake sampler -> (device Batch, metrics)."""
    draw = RolloutDraw(
        data,
        lambda state, tokens, mask, attempt: rollout(tokens, mask, attempt),
        task,
        tokenizer,
        g,
        scorer,
        token_level,
    )
    if greedy is not None:
        decode = lambda state, tokens, mask: greedy(tokens, mask)  # noqa: E731
        draw = WithGreedyBaseline(draw, decode, task, tokenizer, scorer)
    collector = GroupCollector(draw, g, max_refill_rounds=max_refill_rounds)
    collection = collector.collect(None, 1)
    (rows,) = collection.fresh
    return rows.to_batch(), collection.metrics


def prompts(indices):
    """A prompt batch whose answer is always "a"."""
    n = len(indices)
    return {
        "prompt_tokens": np.full((n, 2), 65, np.int32),
        "prompt_mask": np.ones((n, 2), bool),
        "answer": np.tile(np.frombuffer(b"a\0", np.uint8), (n, 1)),
        "answer_len": np.ones(n, np.int32),
        "index": np.asarray(indices, np.int64),
    }


def fake_rollout(solved):
    """Prompt with task index i: sample j answers "a" iff solved(i, j, attempt)."""
    calls = []

    def bind(batch_indices):
        def run(tokens, mask, attempt=0):
            calls.append(attempt)
            rows = [(i, j) for i in batch_indices for j in range(G)]
            comp = np.array([[97 if solved(i, j, attempt) else 98] for i, j in rows], np.int32)
            n = len(rows)
            return Rollout(
                prompt_tokens=np.repeat(np.asarray(tokens), G, 0),
                prompt_mask=np.repeat(np.asarray(mask), G, 0),
                completion_tokens=comp,
                completion_mask=np.ones((n, 1), bool),
                sampling_logprobs=np.full((n, 1), -0.5, np.float32),
                policy_logprobs=np.full((n, 1), -0.5, np.float32),
                group_id=np.arange(n) // G,
            )

        return run

    return bind, calls


def test_informative_groups():
    got = informative_groups(np.array([1, 1, 0, 1, 0, 0, 0.5, 0.5]), 2)
    np.testing.assert_array_equal(got, [False, True, False, False])
    # [B, K] reward components: a group is informative when any component varies in it.
    components = np.array([[1, 0], [1, 0], [1, 0], [1, 0.5], [0, 0], [1, 0]])
    np.testing.assert_array_equal(informative_groups(components, 2), [False, True, True])


def test_without_refill_keeps_the_first_draw():
    batches = [[0, 1, 2]]
    bind, calls = fake_rollout(lambda i, j, a: j == 0)
    data = iter(prompts(b) for b in batches)
    batch, metrics = collect_batch(bind(batches[0]), data, EchoTask(), TOKENIZER, G)
    np.testing.assert_array_equal(batch.rewards, [1, 0, 1, 0, 1, 0])
    np.testing.assert_array_equal(batch.group_id, [0, 0, 1, 1, 2, 2])
    np.testing.assert_array_equal(batch.extras["prompt_id"], [0, 0, 1, 1, 2, 2])
    assert calls == [0] and "refill/rounds" not in metrics
    assert metrics["accuracy"] == 0.5


def test_refill_replaces_all_equal_groups_with_new_prompts():
    # Even task indices are all-equal groups (never solved); odd ones are mixed.
    draws = [[0, 1, 2], [3, 4, 5], [7, 9, 11]]
    solved = lambda i, j, a: i % 2 == 1 and j == 0
    data = iter(prompts(b) for b in draws)
    seen = []

    def rollout(tokens, mask, attempt=0):
        seen.append(attempt)
        return bind(draws[attempt])(tokens, mask, attempt)

    bind, _ = fake_rollout(solved)
    batch, metrics = collect_batch(rollout, data, EchoTask(), TOKENIZER, G, max_refill_rounds=3)
    # Informative groups 1, 3, 5 fill the 3 slots after one refill round (7, 9, 11 not drawn).
    np.testing.assert_array_equal(batch.extras["prompt_id"], [1, 1, 3, 3, 5, 5])
    np.testing.assert_array_equal(batch.group_id, [0, 0, 1, 1, 2, 2])
    np.testing.assert_array_equal(batch.rewards, [1, 0, 1, 0, 1, 0])
    assert seen == [0, 1]
    assert metrics["refill/rounds"] == 1 and metrics["refill/short_groups"] == 0
    np.testing.assert_allclose(metrics["refill/informative_frac"], 1 / 3)


def test_refill_that_runs_out_fills_with_all_equal_groups():
    draws = [[0, 1, 2], [4, 6, 8]]
    data = iter(prompts(b) for b in draws)
    bind, _ = fake_rollout(lambda i, j, a: i == 1 and j == 0)

    def rollout(tokens, mask, attempt=0):
        return bind(draws[attempt])(tokens, mask, attempt)

    batch, metrics = collect_batch(rollout, data, EchoTask(), TOKENIZER, G, max_refill_rounds=1)
    np.testing.assert_array_equal(batch.extras["prompt_id"], [1, 1, 0, 0, 2, 2])
    assert metrics["refill/short_groups"] == 2


def test_greedy_baseline_is_repeated_per_sample():
    draws = [[0, 1]]
    bind, _ = fake_rollout(lambda i, j, a: j == 1)
    greedy_bind, _ = fake_rollout(lambda i, j, a: i == 1)
    data = iter(prompts(b) for b in draws)

    def greedy(tokens, mask):  # one row per prompt
        out = greedy_bind(draws[0])(tokens, mask)
        return out.replace(
            completion_tokens=out.completion_tokens[::G], completion_mask=out.completion_mask[::G]
        )

    batch, _ = collect_batch(bind(draws[0]), data, EchoTask(), TOKENIZER, G, greedy=greedy)
    np.testing.assert_array_equal(batch.extras["baseline_reward"], [0, 0, 1, 1])


def test_negative_rounds_rejected():
    with pytest.raises(ValueError, match="max_refill_rounds=-1"):
        collect_batch(None, iter([]), EchoTask(), TOKENIZER, G, max_refill_rounds=-1)


class Hangs(EchoTask):
    """Hangs on every second sample (a module-level class: process workers unpickle it)."""

    def reward(self, completion: str, answer: str) -> float:
        if completion == "b":
            time.sleep(60)
        return super().reward(completion, answer)


def test_scorer_from_config_runs_the_reward_on_a_pool_with_a_hard_timeout():
    config = get_config()
    config.reward.update(workers=2, kind="process", timeout_s=3.0)  # far below the 60 s hang
    scorer = build_scorer(config)
    batches = [[0, 1, 2]]
    bind, _ = fake_rollout(lambda i, j, a: j == 0)
    start = time.perf_counter()
    data = iter(prompts(b) for b in batches)
    batch, metrics = collect_batch(bind(batches[0]), data, Hangs(), TOKENIZER, G, scorer=scorer)
    assert time.perf_counter() - start < 45  # the hanging calls sleep 60 s
    np.testing.assert_array_equal(batch.rewards, [1, 0, 1, 0, 1, 0])
    assert metrics["reward/failures_timeout"] == 3
    close_shared_pools()


def test_cuts_rows_train_on_the_policy_logprobs():
    bind, _ = fake_rollout(lambda i, j, a: j == 0)
    run = bind([0, 1])

    def with_cuts(tokens, mask, attempt=0):
        out = run(tokens, mask, attempt)
        return out.replace(
            policy_logprobs=np.full_like(out.policy_logprobs, -2.0),
            cuts_rows=np.array([True, False, True, False]),
        )

    batch, _ = collect_batch(with_cuts, iter([prompts([0, 1])]), EchoTask(), TOKENIZER, G)
    np.testing.assert_array_equal(batch.rollout_logprobs[:, 0], [-2.0, -0.5, -2.0, -0.5])


class GroupTask(EchoTask):
    """Scores a prompt's samples together: 10 + the rank of each completion in its group; the
    second call raises, so the second prompt's group fails."""

    def __init__(self):
        self.calls = 0

    def group_rewards(self, completions, answer):
        self.calls += 1
        if self.calls == 2:
            raise RuntimeError("boom")
        return 10.0 + np.argsort(np.argsort(completions))


def test_group_rewards_score_each_group_together_and_contain_failures():
    bind, _ = fake_rollout(lambda i, j, a: j == 0)  # sample 0 answers "a", sample 1 "b"
    data = iter([prompts([0, 1, 2])])
    batch, metrics = collect_batch(bind([0, 1, 2]), data, GroupTask(), TOKENIZER, G)
    np.testing.assert_array_equal(batch.rewards, [10, 11, 0, 0, 10, 11])
    assert metrics["reward/failures_exception"] == 2


class TokenTask:
    """Per-token rewards: +1 on each "a" token, -1 on each "b"; raises on "c"."""

    def reward(self, completion: str, answer: str) -> float:
        raise AssertionError("token_level scoring must not call reward")

    def token_rewards(self, completion: str, answer: str, spans):
        if "c" in completion:
            raise RuntimeError("judge crashed")
        values = np.array([{"a": 1.0, "b": -1.0}.get(completion[s:e], 0.0) for s, e in spans])
        return float(values.sum()), values


def test_token_level_rewards_reach_the_batch_per_token_and_failures_are_contained():
    comps = {0: [97, 98, 258], 1: [97, 97, 256], 2: [99, 258, 256], 3: [98, 256, 256]}
    mask = {0: [1, 1, 1], 1: [1, 1, 0], 2: [1, 1, 0], 3: [1, 0, 0]}

    def rollout(tokens, mask_, attempt=0):
        n = 4
        return Rollout(
            prompt_tokens=np.repeat(np.asarray(tokens), G, 0),
            prompt_mask=np.repeat(np.asarray(mask_), G, 0),
            completion_tokens=np.array([comps[i] for i in range(n)], np.int32),
            completion_mask=np.array([mask[i] for i in range(n)], bool),
            sampling_logprobs=np.zeros((n, 3), np.float32),
            policy_logprobs=np.zeros((n, 3), np.float32),
            group_id=np.arange(n) // G,
        )

    batch, metrics = collect_batch(
        rollout, iter([prompts([0, 1])]), TokenTask(), TOKENIZER, G, token_level=True
    )
    want = [[1, -1, 0], [1, 1, 0], [0, 0, 0], [-1, 0, 0]]  # row 2 raised: zeros, counted
    np.testing.assert_array_equal(batch.extras["token_rewards"], want)
    np.testing.assert_array_equal(batch.rewards, [0, 2, 0, -1])
    assert metrics["reward/failures_exception"] == 1
