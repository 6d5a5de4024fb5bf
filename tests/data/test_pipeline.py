"""grain pipelines: padding layout, determinism, exact state restore, host sharding, errors."""

import re

import numpy as np
import pytest

from rljax.data import (
    AdditionTask,
    decode_answers,
    decode_prompts,
    prompt_batches,
    prompt_dataset,
    sft_dataset,
)
from rljax.models.tokenizer import ByteTokenizer

TOK = ByteTokenizer()
TASK = AdditionTask(test_size=40)
P = 10  # BOS + "999+999=" is 9 tokens


def _batches_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_prompt_example_layout_by_hand():
    ds = prompt_dataset(TASK, "test", TOK, P, seed=None, shard_index=0, shard_count=1)
    example = ds[0]
    text = TASK.example(0, "test")  # seed=None keeps index order
    ids = [TOK.bos_id] + list(text["prompt"].encode())
    expected = [TOK.pad_id] * (P - len(ids)) + ids
    np.testing.assert_array_equal(example["prompt_tokens"], expected)
    np.testing.assert_array_equal(example["prompt_mask"], np.arange(P) >= P - len(ids))
    assert example["prompt_tokens"].dtype == np.int32 and example["prompt_mask"].dtype == bool
    n = len(text["answer"])
    assert example["answer_len"] == n
    assert bytes(example["answer"][:n]).decode() == text["answer"]
    assert not example["answer"][n:].any() and example["answer"].dtype == np.uint8
    assert example["index"] == 0 and example["index"].dtype == np.int64


def test_batches_decode_back_to_the_task_examples():
    ds = prompt_dataset(TASK, "test", TOK, P, seed=3, shard_index=0, shard_count=1)
    batch = next(prompt_batches(ds, 4))
    assert batch["prompt_tokens"].shape == (4, P) and batch["answer"].shape == (4, 32)
    assert batch["index"].shape == (4,) and batch["answer_len"].shape == (4,)
    for i, prompt, answer in zip(batch["index"], decode_prompts(batch, TOK), decode_answers(batch)):
        assert TASK.example(int(i), "test") == {"prompt": prompt, "answer": answer}
        a, b = map(int, prompt[:-1].split("+"))
        assert int(answer) == a + b


def test_shuffle_is_a_seeded_permutation():
    def order(seed):
        ds = prompt_dataset(TASK, "test", TOK, P, seed=seed, shard_index=0, shard_count=1)
        return [int(ds[i]["index"]) for i in range(len(ds))]

    assert order(1) == order(1) != order(2)
    assert sorted(order(1)) == list(range(40))
    assert order(None) == list(range(40))


def test_state_restore_gives_identical_next_batches():
    ds = prompt_dataset(TASK, "train", TOK, P, seed=0, shard_index=0, shard_count=1)
    it = prompt_batches(ds, 3)
    for _ in range(4):
        next(it)
    state = it.get_state()
    expected = [next(it) for _ in range(3)]
    fresh = prompt_batches(
        prompt_dataset(TASK, "train", TOK, P, seed=0, shard_index=0, shard_count=1), 3
    )
    fresh.set_state(state)
    assert all(_batches_equal(e, next(fresh)) for e in expected)


def test_epochs_reshuffle_and_end():
    ds = prompt_dataset(TASK, "test", TOK, P, seed=0, shard_index=0, shard_count=1)
    batches = list(prompt_batches(ds, 8, num_epochs=2))
    assert len(batches) == 10
    epochs = [np.concatenate([b["index"] for b in batches[e * 5 : (e + 1) * 5]]) for e in (0, 1)]
    assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(40))
    assert not np.array_equal(epochs[0], epochs[1])


@pytest.mark.parametrize("size", [40, 39])
def test_shards_are_disjoint_and_cover(size):
    shards = [
        prompt_dataset(
            TASK, "test", TOK, P, seed=7, num_examples=size, shard_index=s, shard_count=2
        )
        for s in (0, 1)
    ]
    indices = [[int(ds[i]["index"]) for i in range(len(ds))] for ds in shards]
    assert not set(indices[0]) & set(indices[1])
    assert sorted(indices[0] + indices[1]) == list(range(size))


def test_default_shard_is_this_process():
    ds = prompt_dataset(TASK, "test", TOK, P)  # one process: the whole split
    assert len(ds) == 40


def test_sft_layout_by_hand():
    ds = sft_dataset(TASK, "test", TOK, P, 6, seed=None, shard_index=0, shard_count=1)
    example = ds[1]
    text = TASK.example(1, "test")
    prompt_ds = prompt_dataset(TASK, "test", TOK, P, seed=None, shard_index=0, shard_count=1)
    np.testing.assert_array_equal(example["prompt_tokens"], prompt_ds[1]["prompt_tokens"])
    np.testing.assert_array_equal(example["prompt_mask"], prompt_ds[1]["prompt_mask"])
    target = list(text["answer"].encode()) + [TOK.eos_id]
    expected = target + [TOK.pad_id] * (6 - len(target))
    np.testing.assert_array_equal(example["completion_tokens"], expected)
    np.testing.assert_array_equal(example["completion_mask"], np.arange(6) < len(target))


def test_sft_batches_shapes_and_restore():
    dataset = sft_dataset(TASK, "train", TOK, P, 6, seed=0, shard_index=0, shard_count=1)
    it = prompt_batches(dataset, 2)
    next(it)
    state = it.get_state()
    expected = next(it)
    assert expected["completion_tokens"].shape == (2, 6) and expected["prompt_mask"].shape == (2, P)
    fresh = prompt_batches(dataset, 2)
    fresh.set_state(state)
    assert _batches_equal(expected, next(fresh))


def test_long_prompt_error_names_prompt_and_limit():
    ds = prompt_dataset(TASK, "test", TOK, 4, seed=None, shard_index=0, shard_count=1)
    prompt = TASK.example(0, "test")["prompt"]
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"prompt {prompt!r} is {len(prompt) + 1} tokens, more than max_prompt_len=4"
        ),
    ):
        ds[0]


def test_long_target_and_answer_errors():
    with pytest.raises(ValueError, match="max_completion_len=2"):
        sft_dataset(TASK, "test", TOK, P, 2, shard_index=0, shard_count=1)[0]
    with pytest.raises(ValueError, match="max_answer_len=1"):
        prompt_dataset(TASK, "test", TOK, P, max_answer_len=1, shard_index=0, shard_count=1)[0]


def test_bad_arguments_raise():
    ds = prompt_dataset(TASK, "test", TOK, P, shard_index=0, shard_count=1)
    with pytest.raises(ValueError, match="fewer than batch_size=41"):
        prompt_batches(ds, 41)
    with pytest.raises(ValueError, match="shard_index=2"):
        prompt_dataset(TASK, "test", TOK, P, shard_index=2, shard_count=2)
    with pytest.raises(ValueError, match="num_examples=41"):
        prompt_dataset(TASK, "test", TOK, P, num_examples=41, shard_index=0, shard_count=1)


def test_format_prompt_and_no_bos():
    dataset = prompt_dataset(
        TASK,
        "test",
        TOK,
        16,
        seed=None,
        shard_index=0,
        shard_count=1,
        format_prompt=lambda p: f"Q: {p}",
        add_bos=False,
    )
    example = dataset[0]
    want = TOK.encode("Q: " + TASK.example(0, "test")["prompt"])
    assert example["prompt_tokens"][example["prompt_mask"]].tolist() == want
