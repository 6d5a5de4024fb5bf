"""Block-R1's sample-level block sizes: the per-row sampler against the scalar sampler row by row,
the best-size and conflict-score rules on hand-computed cases, the reward measurement against
scalar rollouts, and two RL steps of the driver with the option on."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.config import validate_config
from rljax.diffusion import collect, engine
from rljax.diffusion.block_size import (
    best_block_sizes,
    block_size_conflict_score,
    measure_rewards_by_size,
)
from rljax.diffusion.policy import create_diffusion_model, diffusion_config
from rljax.diffusion.sampler import (
    diffusion_generate,
    diffusion_generate_per_row,
    num_transfer_tokens,
)
from rljax.train import train

CONFIG = diffusion_config(
    11, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, rope_theta=10.0
)
MASK = CONFIG.mask_id
PROMPTS = jnp.array([[0, 0, 3, 4], [9, 2, 3, 4], [5, 6, 7, 8]], jnp.int32)
PROMPT_MASK = jnp.array([[False, False, True, True], [True] * 4, [True] * 4])
G, STEPS = 8, 8  # every size in (1, 2, 4, 8) splits the 8 steps evenly over its blocks
FIELDS = ("completion_tokens", "completion_mask", "step_map", "token_probs", "block_ids")


def _scale(path, x):
    """Sharper, position-dependent predictions than the 0.02-std init gives (fewer ties)."""
    name = "/".join(str(k) for k in path)
    for part, factor in (("lm_head", 20.0), ("q_proj", 30.0), ("k_proj", 30.0), ("embed", 10.0)):
        if part in name:
            return x * factor
    return x * (10.0 if ("v_proj" in name or "o_proj" in name) else 1.0)


@pytest.fixture(scope="module")
def model():
    graphdef, params = create_diffusion_model(CONFIG, seed=0)
    return graphdef, jax.tree_util.tree_map_with_path(_scale, params)


def per_row(model, sizes, rng=0, **kwargs):
    graphdef, params = model
    kwargs = dict(gen_length=G, num_steps=STEPS, mask_id=MASK) | kwargs
    sizes = jnp.asarray(sizes, jnp.int32)
    return diffusion_generate_per_row(
        graphdef, params, PROMPTS, PROMPT_MASK, jax.random.key(rng), sizes, **kwargs
    )


def scalar(model, size, rng=0, **kwargs):
    graphdef, params = model
    return diffusion_generate(
        graphdef,
        params,
        PROMPTS,
        PROMPT_MASK,
        jax.random.key(rng),
        gen_length=G,
        block_size=size,
        steps_per_block=STEPS * size // G,
        mask_id=MASK,
        **kwargs,
    )


def test_all_equal_sizes_reproduce_the_scalar_sampler_bit_for_bit(model):
    ref = scalar(model, 2)
    out = per_row(model, [2, 2, 2])
    for field in FIELDS:
        np.testing.assert_array_equal(getattr(out, field), getattr(ref, field), err_msg=field)


def test_mixed_greedy_rows_equal_scalar_runs_at_their_own_size(model):
    sizes = [2, 8, 1]
    out = per_row(model, sizes)
    for row, size in enumerate(sizes):
        ref = scalar(model, size)
        for field in FIELDS:
            np.testing.assert_array_equal(
                getattr(out, field)[row], getattr(ref, field)[row], err_msg=(field, size)
            )
    # The sizes matter: the three layouts give three different step maps for one prompt.
    maps = [np.asarray(scalar(model, s).step_map[0]) for s in (1, 2, 8)]
    assert len({m.tobytes() for m in maps}) == 3


@pytest.mark.parametrize("kwargs", [dict(temperature=0.7), dict(remasking="random")])
def test_mixed_sampled_rows_equal_a_batch_run_entirely_at_their_size(model, kwargs):
    sizes = [4, 1, 2]
    out = per_row(model, sizes, rng=3, **kwargs)
    for row, size in enumerate(sizes):
        ref = per_row(model, [size] * 3, rng=3, **kwargs)
        for field in FIELDS:
            np.testing.assert_array_equal(
                getattr(out, field)[row], getattr(ref, field)[row], err_msg=(field, size)
            )
    other = per_row(model, sizes, rng=4, **kwargs)
    field = "completion_tokens" if "temperature" in kwargs else "step_map"
    assert not np.array_equal(getattr(out, field), getattr(other, field))


def test_block_size_one_unmasks_strictly_left_to_right_and_others_follow_their_schedule(model):
    sizes = [1, 4, 8]
    out = per_row(model, sizes, temperature=0.7)
    steps = np.asarray(out.step_map)
    np.testing.assert_array_equal(steps[0], np.arange(G))
    for row, size in enumerate(sizes):
        per_block = STEPS * size // G
        blocks = np.arange(G) // size
        np.testing.assert_array_equal(out.block_ids[row], blocks)
        np.testing.assert_array_equal(steps[row] // per_block, blocks)
        counts = np.bincount(steps[row], minlength=STEPS)
        schedule = np.asarray(num_transfer_tokens(size, per_block))
        np.testing.assert_array_equal(counts, np.tile(schedule, G // size))
    assert not np.any(np.asarray(out.completion_tokens) == MASK)


def test_per_row_sizes_are_checked(model):
    with pytest.raises(ValueError, match="block size 3"):
        per_row(model, [2, 3, 2])
    with pytest.raises(ValueError, match="block size 1"):  # 8 blocks do not divide 4 steps
        per_row(model, [1, 2, 2], num_steps=4)


def test_best_block_sizes_takes_the_highest_reward_and_the_larger_size_on_ties():
    rewards = np.array([[0.5, 0.75, 0.25], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.2, 0.1, 0.3]])
    np.testing.assert_array_equal(best_block_sizes(rewards, (2, 4, 8)), [1, 1, 2, 2])
    # Unsorted candidates: the tie of row 1 goes to the index of size 8.
    np.testing.assert_array_equal(best_block_sizes(rewards, (8, 2, 4)), [1, 0, 0, 2])
    with pytest.raises(ValueError, match="one column per candidate"):
        best_block_sizes(rewards, (2, 4))
    with pytest.raises(ValueError, match="distinct"):
        best_block_sizes(rewards, (2, 2, 4))


def test_conflict_score_counts_samples_off_their_domain_majority():
    best = np.array([2, 2, 4, 8, 8, 8])
    domains = np.array(["math", "math", "math", "code", "code", "code"])
    # math majority 2 (2 of 3 agree), code majority 8 (3 of 3): 1 - 5/6.
    assert block_size_conflict_score(best, domains) == pytest.approx(1 / 6)
    # One shared size for the mixture: majority 8, 3 of 6 agree.
    assert block_size_conflict_score(best) == pytest.approx(0.5)
    assert block_size_conflict_score(np.array([4, 4, 4])) == 0.0
    # A tie of majorities (2 and 4 once each) picks 4; one of two samples agrees either way.
    assert block_size_conflict_score(np.array([2, 4])) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="domains has shape"):
        block_size_conflict_score(best, domains[:3])


def test_measure_rewards_by_size_matches_greedy_scalar_rollouts(model):
    graphdef, params = model
    candidates = (1, 2, 8)

    def reward_fn(tokens, prompt_index):
        return (tokens.sum(-1) % 7) + 10.0 * prompt_index

    rewards = measure_rewards_by_size(
        graphdef,
        params,
        np.asarray(PROMPTS),
        np.asarray(PROMPT_MASK),
        jax.random.key(0),
        reward_fn,
        block_sizes=candidates,
        group_size=2,
        gen_length=G,
        num_steps=STEPS,
        mask_id=MASK,
        temperature=0.0,
    )
    expected = np.stack(
        [
            reward_fn(np.asarray(scalar(model, size).completion_tokens), np.arange(3))
            for size in candidates
        ],
        axis=1,
    )
    np.testing.assert_array_equal(rewards, expected)
    assert len(np.unique(rewards % 10)) > 1  # the rewards vary, so the layout is tested


def _block_r1_config(tiny_config, **rollout):
    """RLDF with candidate block sizes 1, 2, 4 over 4 tokens in 4 denoising steps."""
    config = tiny_config(name="rldf")
    config.rollout.update({"steps_per_block": 4, "block_sizes": (1, 2, 4), **rollout})
    config.train.epochs = 1
    return config


def test_driver_trains_each_prompt_at_its_measured_best_size(
    monkeypatch, tmp_path, tiny_config, alternating_task
):
    # The real measurement runs (shape checked); its result is replaced by best sizes that are
    # known: even prompts -> 1 (highest reward), odd ones -> 4 (a three-way tie, larger wins).
    measured, used = [], []

    def best(rewards_by_size, sizes):
        measured.append(np.shape(rewards_by_size))
        return best_block_sizes(np.array([[0.5, 0.0, 0.0], [0.5, 0.5, 0.5]] * 4), sizes)

    def sharded(rollout, mesh):
        run = collect.sharded_rollout(rollout, mesh)

        def record(state, tokens, mask, attempt=0, block_sizes=None, salt=0):
            if salt == 0:  # the training rollout: its per-prompt sizes
                used.append(np.asarray(block_sizes).tolist())
            return run(state, tokens, mask, attempt, block_sizes, salt)

        return record

    monkeypatch.setattr(collect, "best_block_sizes", best)
    monkeypatch.setattr(engine, "sharded_rollout", sharded)
    config = _block_r1_config(tiny_config)
    config.task.name = alternating_task
    config.train.update(steps=2, eval_every=2, checkpoint_every=2)
    config.sft.steps = 0
    config.run_dir = str(tmp_path)
    records = {r["step"]: r for r in train(config)}
    for step in (1, 2):  # RLDF replays states from the per-row step maps
        metrics = records[step]
        assert np.isfinite(metrics["loss"]) and metrics["grad_norm"] > 0
        assert metrics["block_size/mean"] == 2.5
    assert measured == [(8, 3)] * 2
    assert used == [[1, 4] * 4] * 2


def test_validation_rejects_block_sizes_that_do_not_fit_the_step_budget(tiny_config):
    validate_config(_block_r1_config(tiny_config))
    with pytest.raises(ValueError, match="block_sizes entry 3"):
        validate_config(_block_r1_config(tiny_config, block_sizes=(2, 3)))
    with pytest.raises(ValueError, match="block_sizes entry 1"):  # 4 blocks, 2 steps
        validate_config(_block_r1_config(tiny_config, steps_per_block=2))
