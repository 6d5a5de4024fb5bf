"""LoPE: all-failed detection, prefixes, replacement counts, kept failure, prompt restored."""

import numpy as np
import pytest

from rljax.data.samplers.lope import (
    LOREM_WORDS,
    LoPESettings,
    all_failed,
    lorem_prefix,
    merge,
    perturbed_prompts,
)


def _rows(n, prompt_id, rewards, start):
    return {
        "prompt_tokens": np.tile(np.array([prompt_id, prompt_id + 1]), (n, 1)),
        "prompt_mask": np.ones((n, 2), bool),
        "completion_tokens": np.arange(start, start + 3 * n).reshape(n, 3),
        "rewards": np.asarray(rewards, np.float64),
    }


def test_all_failed():
    rewards = np.array([0, 0, 0, 1, 0, 0, -1, -1, 0], float)
    np.testing.assert_array_equal(all_failed(rewards, 3), [True, False, True])
    with pytest.raises(ValueError, match="group_size"):
        all_failed(rewards, 4)


def test_prefix_word_counts_and_determinism():
    settings = LoPESettings()
    counts = []
    for seed in range(40):
        text = lorem_prefix(np.random.default_rng(seed), settings.min_words, settings.max_words)
        words = text.split()
        counts.append(len(words))
        assert {w.strip(".").lower() for w in words} <= set(LOREM_WORDS)
        assert text[0].isupper() and text.endswith(".")
    assert min(counts) >= 100 and max(counts) <= 300 and len(set(counts)) > 20
    a = perturbed_prompts("What is 2+3?", np.random.default_rng((7, 3, 1)), settings)
    b = perturbed_prompts("What is 2+3?", np.random.default_rng((7, 3, 1)), settings)
    assert a == b and len(a) == 6 and len(set(a)) == 6
    assert all(p.endswith("\n\nWhat is 2+3?") for p in a)
    assert all(100 <= len(p.split("\n\n")[0].split()) <= 300 for p in a)


@pytest.mark.parametrize("num_correct", [0, 2, 3, 4, 10])
def test_merge_counts_keep_a_failure_and_restore_prompt(num_correct):
    n, m = 4, 24
    original = _rows(n, prompt_id=5, rewards=np.zeros(n), start=0)
    pert_rewards = np.zeros(m)
    pert_rewards[np.random.default_rng(num_correct).permutation(m)[:num_correct]] = 1.0
    perturbed = _rows(m, prompt_id=50, rewards=pert_rewards, start=1000)
    out = merge(original, perturbed, np.random.default_rng(0))
    replaced = min(num_correct, n - 1)
    assert out.replaced.sum() == replaced
    assert (out.rows["rewards"] > 0).sum() == replaced
    assert (out.rows["rewards"] <= 0).sum() >= 1  # at least one original failure stays
    # Prompts are the original's; replaced completions come from correct perturbed rows.
    np.testing.assert_array_equal(out.rows["prompt_tokens"], original["prompt_tokens"])
    for i in range(n):
        src = out.source[i]
        if out.replaced[i]:
            assert pert_rewards[src] > 0
            np.testing.assert_array_equal(
                out.rows["completion_tokens"][i], perturbed["completion_tokens"][src]
            )
        else:
            assert src == -1
            np.testing.assert_array_equal(
                out.rows["completion_tokens"][i], original["completion_tokens"][i]
            )
    assert len(set(out.source[out.replaced].tolist())) == replaced  # distinct rollouts
    np.testing.assert_array_equal(out.stats_scores, out.rows["rewards"])
    # Inputs are not modified.
    assert (original["rewards"] == 0).all()


def test_merge_random_choice_and_pooled_scores():
    original = _rows(3, 1, np.zeros(3), 0)
    perturbed = _rows(8, 9, np.array([1, 1, 1, 1, 0, 0, 1, 0], float), 100)
    used = set()
    for seed in range(20):
        out = merge(original, perturbed, np.random.default_rng(seed), pooled_stats=True)
        used |= set(out.source[out.replaced].tolist())
        np.testing.assert_array_equal(
            out.stats_scores, np.concatenate([np.zeros(3), perturbed["rewards"]])
        )
    assert used == {0, 1, 2, 3, 6}  # any correct rollout may be chosen


def test_merge_rejects_bad_groups():
    with pytest.raises(ValueError, match="all failed"):
        merge(_rows(2, 1, [0.0, 1.0], 0), _rows(2, 2, [1.0, 1.0], 9), np.random.default_rng(0))
    with pytest.raises(ValueError, match="n >= 2"):
        merge(_rows(1, 1, [0.0], 0), _rows(2, 2, [1.0, 1.0], 9), np.random.default_rng(0))
