"""Diffusion rollouts into HostBatches: decoding with specials visible, contained scoring,
group advantages, and Block-R1's per-prompt block sizes."""

import numpy as np

from rljax.advantages.group import grpo_advantages
from rljax.data import AdditionTask
from rljax.diffusion.collect import DiffusionDraw, decode_texts, decode_visible
from rljax.diffusion.sampler import DiffusionRollout
from rljax.models.tokenizer import ByteTokenizer
from rljax.train.scoring import score_rollout
from rljax.train.staleness import Policies


def test_decode_texts_stops_at_eos_and_shows_specials():
    tok = ByteTokenizer()
    tokens = np.array([[49, 57, 258, 50], [55, 256, 258, 258], [51, 51, 51, 51]])
    assert decode_texts(tok, tokens) == ["19", "7<pad>", "3333"]


def _prompts(answers):
    """A prompt batch of len(answers) prompts ("1+1=") with the given answers."""
    n = len(answers)
    answer = np.zeros((n, 4), np.uint8)
    for i, a in enumerate(answers):
        answer[i, : len(a)] = list(a.encode())
    return {
        "prompt_tokens": np.tile(np.array([257, 49, 43, 49, 61], np.int32), (n, 1)),
        "prompt_mask": np.ones((n, 5), bool),
        "answer": answer,
        "answer_len": np.array([len(a) for a in answers]),
        "index": np.arange(n),
    }


def test_score_rewards_and_group_advantages():
    tok = ByteTokenizer()
    # "19", " 7" (a space: wrong), "3", "3" against answers 19, 8 (group 1) and 3, 3 (group 2).
    tokens = np.array([[49, 57, 258, 258], [32, 55, 258, 258], [51, 258, 0, 0], [51, 258, 1, 1]])
    rewards, failures = score_rollout(
        AdditionTask(), tok, _prompts(["19", "3"]), tokens, None, 2, decode=decode_visible
    )
    rewards = np.asarray(rewards)
    assert sum(failures.values()) == 0
    # " 7" vs "8" is wrong either way; the group of the first prompt is "19" and " 7".
    np.testing.assert_array_equal(rewards, [1.0, 0.0, 1.0, 1.0])
    adv = np.asarray(grpo_advantages(rewards, 2))
    # Group [1, 0]: centred +-0.5 over the ddof=1 std sqrt(0.5); group [1, 1]: all 0.
    np.testing.assert_allclose(adv, [0.5 / np.sqrt(0.5), -0.5 / np.sqrt(0.5), 0, 0], atol=1e-5)


def test_decoding_keeps_a_stray_pad_visible_so_the_answer_is_wrong():
    tok = ByteTokenizer()
    tokens = np.array([[51, 256, 258, 258], [51, 258, 258, 258]])  # "3<pad>" and "3"
    rewards, _ = score_rollout(
        AdditionTask(), tok, _prompts(["3"]), tokens, None, 2, decode=decode_visible
    )
    np.testing.assert_array_equal(rewards, [0.0, 1.0])


class _FakeRollout:
    """Answers "2" when a row's block size is 2, else "1"; records the calls."""

    def __init__(self):
        self.calls = []

    def __call__(self, state, tokens, mask, attempt=0, block_sizes=None, salt=0):
        n = len(tokens) * 2  # G = 2
        sizes = np.full(len(tokens), 4) if block_sizes is None else np.asarray(block_sizes)
        self.calls.append((len(tokens), None if block_sizes is None else sizes.tolist(), salt))
        digit = np.where(np.repeat(sizes, 2) == 2, 50, 49)
        completion = np.stack([digit, np.full(n, 258), np.full(n, 258), np.full(n, 258)], 1)
        return DiffusionRollout(
            prompt_tokens=np.repeat(tokens, 2, 0),
            prompt_mask=np.repeat(mask, 2, 0),
            completion_tokens=completion.astype(np.int32),
            completion_mask=np.arange(4)[None, :] <= 1 + np.zeros((n, 1), int),
            step_map=np.tile(np.arange(4), (n, 1)),
            token_probs=np.full((n, 4), 0.5, np.float32),
            block_ids=np.zeros((n, 4), np.int32),
        )


def test_block_r1_draw_samples_each_prompt_at_its_best_block_size():
    # Prompt 0's answer is "2" (best at block size 2), prompt 1's is "1" (equal rewards at
    # sizes 1 and 4: the larger size wins, Block-R1's tie rule).
    prompts = _prompts(["2", "1"])
    rollout = _FakeRollout()
    draw = DiffusionDraw(
        iter([prompts]), rollout, AdditionTask(), ByteTokenizer(), 2, block_sizes=(1, 2, 4)
    )
    drawn = draw(Policies(None, None, None, 0), 1, 0)
    # The measurement: each prompt at each candidate (n * S prompt rows), with its own salt.
    assert rollout.calls[0] == (6, [1, 2, 4, 1, 2, 4], 1)
    assert rollout.calls[1] == (2, [2, 4], 0)
    assert drawn.metrics["block_size/mean"] == 3.0
    assert drawn.metrics["block_size/reward_at_2"] == 0.5
    rows = drawn.rows.rows
    np.testing.assert_array_equal(rows["rewards"], [1.0, 1.0, 1.0, 1.0])
    np.testing.assert_array_equal(rows["prompt_id"], [0, 0, 1, 1])
    assert rows["step_map"].shape == rows["token_probs"].shape == (4, 4)
