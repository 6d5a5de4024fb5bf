"""LoRA (rljax.models.lora): the merge's maths, an exact start, and a train state whose update
changes the adapters only, with the frozen base as the KL reference."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

from rljax.algorithms import PPOSettings, grpo
from rljax.config import default_config, validate_config
from rljax.core.batch import make_batch
from rljax.core.state import init_train_state
from rljax.models import lora
from rljax.models.config import TransformerConfig
from rljax.models.int8 import dequantized
from rljax.models.low_rank import LoraKernel
from rljax.models.transformer import create_model, forward, positions_from_mask
from rljax.rollout.sampler import generate
from rljax.train import checkpoint
from rljax.train.checkpoint import Checkpointer
from rljax.train.steps import RolloutConfig, UpdateConfig, make_steps

CONFIG = TransformerConfig(vocab_size=30, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=32)
MOE = TransformerConfig(
    vocab_size=30, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, num_experts=4
)
ROLLOUT = RolloutConfig(max_new_tokens=5, n_samples=4, eos_id=1, pad_id=0)
ALL = tuple(lora.TARGETS)


def leaves(tree):
    return {
        jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(tree)
    }


def randomized(adapters, seed=1):
    """The adapters with B random too (fresh adapters have B = 0)."""
    keys = iter(jax.random.split(jax.random.PRNGKey(seed), len(jax.tree.leaves(adapters))))
    return jax.tree.map(lambda x: jax.random.normal(next(keys), x.shape), adapters)


@pytest.mark.parametrize("config", [CONFIG, MOE], ids=["dense", "moe"])
def test_merge_is_w_plus_scaled_a_times_b_per_kernel_layout(config):
    _, base = create_model(config, seed=0)
    adapters = randomized(lora.init_adapters(base, 3, ALL, jax.random.PRNGKey(0)))
    merged = leaves(lora.merge(base, adapters, 0.5))
    before = leaves(base)
    changed = set()
    for path, adapter in lora._flat(adapters).items():
        key = "".join(f"[{int(n)}]" if n.isdigit() else f"['{n}']" for n in path) + ".value"
        w, a, b = before[key], np.asarray(adapter["a"]), np.asarray(adapter["b"])
        if path[-1] == "o_proj":  # [heads, head_dim, d]: two input axes
            want = w + 0.5 * (a @ b).reshape(w.shape)
        elif path[-1] in ("q_proj", "k_proj", "v_proj"):  # [d, heads, head_dim]
            want = w + 0.5 * (a @ b).reshape(w.shape)
        else:  # [in, out], or [experts, in, out] with one adapter per expert
            want = w + 0.5 * np.matmul(a, b)
            x = np.random.default_rng(0).normal(size=(3, w.shape[-2])).astype(np.float32)
            # The unmerged path gives the same outputs: x W' == x W + scale (x A) B.
            np.testing.assert_allclose(
                x @ merged[key], x @ w + 0.5 * ((x @ a) @ b), rtol=1e-5, atol=1e-5
            )
        np.testing.assert_allclose(merged[key], want, rtol=1e-6, atol=1e-6)
        changed.add(key)
    assert {k.split("[")[-1] for k in changed} >= {"'q_proj'].value", "'o_proj'].value"}
    assert len(changed) == 7  # q, k, v, o, gate, up, down, each stacked over the layers
    if config.num_experts:  # per layer and expert: A [L, E, in, r], B [L, E, r, out]
        up = lora._flat(adapters)[("layers", "mlp", "up_proj")]
        assert up["a"].shape == (1, 4, 16, 3) and up["b"].shape[:3] == (1, 4, 3)
    for key in set(before) - changed:  # embeddings, norms, router, head: the base's own
        np.testing.assert_array_equal(merged[key], before[key])


@pytest.mark.parametrize("config", [CONFIG, MOE], ids=["dense", "moe"])
def test_unmerged_adapters_give_the_merged_logits_and_samples(config):
    _, base = create_model(config, seed=0)
    graphdef, _ = create_model(config, seed=0)
    adapters = randomized(lora.init_adapters(base, 3, ALL, jax.random.PRNGKey(0)))
    unmerged = lora.unmerged(base, adapters, 0.5)
    kernels = [x for x in jax.tree.leaves(unmerged, is_leaf=lambda x: isinstance(x, LoraKernel))]
    # q/k/v/o (and the dense MLP's three) stay unmerged, each stacked over the layers with a
    # per-layer scale; MoE experts are merged.
    lora_kernels = [x for x in kernels if isinstance(x, LoraKernel)]
    assert len(lora_kernels) == (4 if config.num_experts else 7)
    assert all(k.scale.shape == (config.n_layers,) for k in lora_kernels)
    tokens = jnp.asarray([[3, 4, 5, 6, 7], [0, 0, 8, 9, 10]], jnp.int32)
    mask = tokens > 0
    positions = positions_from_mask(mask)
    run = jax.jit(forward, static_argnums=0)
    merged_logits, _ = run(graphdef, lora.merge(base, adapters, 0.5), tokens, positions, mask)
    logits, _ = run(graphdef, unmerged, tokens, positions, mask)
    base_logits, _ = run(graphdef, base, tokens, positions, mask)
    np.testing.assert_allclose(logits[mask], merged_logits[mask], rtol=1e-5, atol=1e-5)
    assert np.max(np.abs(logits - base_logits)[mask]) > 0.1  # the adapters matter
    # The sampler (cached decode) draws the same tokens with either form.
    rollouts = [
        generate(
            graphdef, p, tokens, mask, jax.random.PRNGKey(2), max_new_tokens=6, eos_id=1, pad_id=0
        )
        for p in (lora.merge(base, adapters, 0.5), unmerged)
    ]
    np.testing.assert_array_equal(rollouts[0].completion_tokens, rollouts[1].completion_tokens)
    np.testing.assert_allclose(
        rollouts[0].sampling_logprobs, rollouts[1].sampling_logprobs, rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("param_dtype", ["float32", "bfloat16"])
def test_fresh_adapters_merge_to_the_base_bit_for_bit(param_dtype):
    config = TransformerConfig(**{**CONFIG.__dict__, "param_dtype": param_dtype})
    _, base = create_model(config, seed=0)
    adapters = lora.init_adapters(base, 4, ALL, jax.random.PRNGKey(0))
    merged, before = leaves(lora.merge(base, adapters, 4.0)), leaves(base)
    assert merged.keys() == before.keys()
    for key in before:
        assert merged[key].dtype == before[key].dtype
        assert merged[key].tobytes() == before[key].tobytes(), key
    # A is random (scaled by 1/sqrt(fan-in)) and B zero: the gradient reaches B first.
    flat = lora._flat(adapters)
    q = flat[("layers", "attn", "q_proj")]  # one adapter per layer
    assert q["a"].shape == (2, 16, 4) and q["b"].shape == (2, 4, 16)
    assert 0.1 < float(jnp.std(q["a"])) * 4 < 2.0 and not np.any(np.asarray(q["b"]))


def test_unknown_or_missing_targets_are_named():
    _, base = create_model(CONFIG, seed=0)
    with pytest.raises(ValueError, match=r"lora.targets has unknown \['qkv'\]"):
        lora.init_adapters(base, 2, ("q", "qkv"), jax.random.PRNGKey(0))


def lora_state(kl_coef, rank=4):
    graphdef, params = create_model(CONFIG, seed=0)
    algorithm = grpo(group_size=ROLLOUT.n_samples, ppo=PPOSettings(kl_coef=kl_coef))
    optimizer = optax.adam(1e-2)
    base = lora.frozen_base(params, rank, 8.0)
    adapters = lora.init_adapters(params, rank, ("q", "v", "down"), jax.random.PRNGKey(1))
    state = init_train_state(
        adapters, optimizer, algorithm.transform, jax.random.PRNGKey(0), base=base
    )
    steps = make_steps(graphdef, optimizer, algorithm, ROLLOUT, UpdateConfig(minibatches=2))
    return graphdef, params, optimizer, steps, state


def rollout_batch(steps, state):
    prompts = jnp.asarray([[0, 5, 6], [7, 8, 9]], jnp.int32)
    rollout = steps.rollout(state, prompts, prompts > 0)
    return make_batch(
        rollout.prompt_tokens,
        rollout.prompt_mask,
        rollout.completion_tokens,
        rollout.completion_mask,
        rollout.group_id,
        (rollout.completion_tokens[:, 0] % 2).astype(jnp.float32),
        rollout_logprobs=rollout.sampling_logprobs,
    )


def test_a_grpo_update_trains_the_adapters_only_against_the_base_as_reference():
    graphdef, params, optimizer, steps, state = lora_state(kl_coef=0.1)
    base_before = leaves(params)
    adapters_before = leaves(state.params)
    # Only adapter moments: Adam's mu and nu are shaped like the adapters, nothing else.
    opt_leaves = jax.tree.leaves(state.opt_state)
    assert sum(x.size for x in opt_leaves) == 2 * lora.count(state.params) + 1  # + count
    assert state.ref_params is None  # no second copy of the weights
    for _ in range(2):  # the second update starts from adapted weights (B != 0)
        batch = rollout_batch(steps, state)
        state, batch, prepared = steps.prepare(state, batch)
        state, metrics = steps.update(state, batch)
    assert float(prepared["kl_to_ref"]) > 0  # the policy had moved away from the base
    assert float(metrics["lora/trainable_params"]) == lora.count(state.params)
    assert float(metrics["lora/base_params"]) == lora.count(params)
    for key, value in leaves(state.base.params).items():
        assert value.tobytes() == base_before[key].tobytes(), key  # frozen, bit for bit
    assert any(
        not np.array_equal(value, adapters_before[key])
        for key, value in leaves(state.params).items()
        if key.endswith("['b']")
    )
    # The reference log-probs are the base's (no adapters), the policy's the merged weights'.
    batch = rollout_batch(steps, state)
    _, prepared, _ = steps.prepare(state, batch)
    base_state = init_train_state(params, optimizer, grpo(group_size=4).transform, state.rng)
    args = (batch.prompt_tokens, batch.prompt_mask, batch.completion_tokens, batch.completion_mask)
    np.testing.assert_array_equal(prepared.ref_logprobs, steps.logprobs(base_state, *args))
    merged_state = base_state.replace(params=lora.merged_params(state))
    np.testing.assert_array_equal(steps.logprobs(state, *args), steps.logprobs(merged_state, *args))
    assert not np.allclose(prepared.ref_logprobs, steps.logprobs(state, *args))


def test_checkpoints_hold_adapters_only_and_refuse_another_base(tmp_path):
    _, params, optimizer, steps, state = lora_state(kl_coef=0.0)
    state = state.replace(params=randomized(state.params))
    with Checkpointer(str(tmp_path), 2, async_save=False) as checkpointer:
        checkpointer.save(1, state, {"i": 1})
        stored = ocp.StandardCheckpointer().metadata(str(tmp_path / "1" / "state"))
        saved = checkpoint._flat_shapes(stored.item_metadata.tree)
        restored, _ = checkpointer.restore(1, state)
        for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state), strict=True):
            np.testing.assert_array_equal(a, b)
        _, other = create_model(CONFIG, seed=1)
        like = state.replace(base=lora.frozen_base(other, 4, 8.0))
        with pytest.raises(ValueError, match="LoRA adapters of another base model"):
            checkpointer.restore(1, like)
    # The adapters, their Adam moments, the scale and the fingerprint; no base weight.
    assert ("base", "fingerprint") in saved and ("base", "scale") in saved
    assert not [k for k in saved if "embed" in k or k[:2] == ("base", "params")]
    assert sum(np.prod(shape) for shape, _ in saved.values()) < lora.count(params) / 2


def test_the_rollout_step_samples_the_same_with_unmerged_adapters(monkeypatch):
    calls, unmerged_fn = [], lora.unmerged

    def spy(*args):
        calls.append(1)
        return unmerged_fn(*args)

    monkeypatch.setattr(lora, "unmerged", spy)
    graphdef, _, optimizer, steps, state = lora_state(kl_coef=0.0)
    state = state.replace(params=randomized(state.params))
    algorithm = grpo(group_size=ROLLOUT.n_samples)
    rollout = dataclasses.replace(ROLLOUT, lora_unmerged=True)
    unmerged = make_steps(graphdef, optimizer, algorithm, rollout, UpdateConfig())
    prompts = jnp.asarray([[0, 5, 6], [7, 8, 9]], jnp.int32)
    a = steps.rollout(state, prompts, prompts > 0)
    assert not calls  # the default sampler merges
    b = unmerged.rollout(state, prompts, prompts > 0)
    assert calls  # lora_unmerged: the sampler's weights come from lora.unmerged
    np.testing.assert_array_equal(a.completion_tokens, b.completion_tokens)
    np.testing.assert_allclose(a.sampling_logprobs, b.sampling_logprobs, rtol=1e-5, atol=1e-5)


def nbytes(tree):
    return sum(x.nbytes for x in jax.tree.leaves(tree))


@pytest.mark.parametrize("config", [CONFIG, MOE], ids=["dense", "moe"])
def test_int8_base_is_a_quarter_of_the_kernels_and_keeps_the_logits_close(config):
    graphdef, params = create_model(config, seed=0)
    base = lora.frozen_base(params, 4, 8.0, "int8")
    # Adapters are laid out from the stored (int8) base as from the float one.
    fresh = lora.init_adapters(base.params, 4, ALL, jax.random.PRNGKey(0))
    assert jax.tree.map(np.shape, fresh) == jax.tree.map(
        np.shape, lora.init_adapters(params, 4, ALL, jax.random.PRNGKey(0))
    )
    kernels = {k: v for k, v in leaves(params).items() if "_proj" in k}
    stored = leaves(base.params)
    codes = {k: v for k, v in stored.items() if k.endswith(".q")}
    assert len(codes) == len(kernels) and all(v.dtype == np.int8 for v in codes.values())
    assert nbytes(base.params) < 0.45 * nbytes(params)  # float32 kernels -> int8 + scales
    assert lora.count(base.params) == lora.count(params)
    # Each dequantized weight is within half a step (its channel's max / 127 / 2) of the base.
    for key, w in kernels.items():
        w_hat = stored[key.replace(".value", ".value.q")].astype(np.float32)
        w_hat = w_hat * stored[key.replace(".value", ".value.scale")]
        attention = any(f"'{n}_proj'" in key for n in "qkv")
        # Input axes: o [heads, head_dim, d] two, q/k/v [d, heads, head_dim] the first, MLP
        # [(E,) in, out] the second-last.
        in_axes = (-3, -2) if "o_proj" in key else (-3,) if attention else (-2,)
        step = np.max(np.abs(w), axis=in_axes, keepdims=True) / 127
        assert np.all(np.abs(w_hat - w) <= step / 2 * (1 + 1e-6)), key
    # The policy is the dequantized base (+ adapters): logits within 1% of the float base's.
    adapters = randomized(lora.init_adapters(params, 4, ALL, jax.random.PRNGKey(0)))
    tokens = jnp.asarray([[3, 4, 5, 6, 7], [0, 0, 8, 9, 10]], jnp.int32)
    mask = tokens > 0
    run = jax.jit(forward, static_argnums=0)
    args = (tokens, positions_from_mask(mask), mask)
    exact, _ = run(graphdef, lora.merge(params, adapters, 0.01), *args)
    quantized, _ = run(graphdef, lora.merge(base.params, adapters, 0.01), *args)
    unmerged, _ = run(graphdef, lora.unmerged(base.params, adapters, 0.01), *args)
    err = np.max(np.abs(quantized - exact)[mask]) / np.max(np.abs(exact)[mask])
    assert 0 < err < 1e-2, err
    np.testing.assert_allclose(unmerged[mask], quantized[mask], rtol=1e-5, atol=1e-5)


def test_a_qlora_update_keeps_the_int8_base_and_reads_it_as_the_reference():
    graphdef, params, optimizer, steps, state = lora_state(kl_coef=0.1)
    state = state.replace(base=lora.frozen_base(params, 4, 8.0, "int8"))
    before = leaves(state.base.params)
    for _ in range(2):
        batch = rollout_batch(steps, state)
        state, batch, prepared = steps.prepare(state, batch)
        state, metrics = steps.update(state, batch)
    assert np.isfinite(float(metrics["loss"])) and float(prepared["kl_to_ref"]) > 0
    for key, value in leaves(state.base.params).items():
        assert value.tobytes() == before[key].tobytes(), key
    batch = rollout_batch(steps, state)
    _, prepared, _ = steps.prepare(state, batch)
    base_state = init_train_state(
        dequantized(state.base.params), optimizer, grpo(group_size=4).transform, state.rng
    )
    args = (batch.prompt_tokens, batch.prompt_mask, batch.completion_tokens, batch.completion_mask)
    np.testing.assert_array_equal(prepared.ref_logprobs, steps.logprobs(base_state, *args))


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"sft": {"steps": 10}}, "sft.steps=10 does not combine with lora.rank=4"),
        ({"lora": {"targets": ("q", "qkv")}}, r"lora.targets=\('q', 'qkv'\) must be"),
        (
            {"lora": {"sampler": "unmerged"}, "rollout": {"weight_format": "mxfp4"}},
            "lora.sampler='unmerged' does not combine with rollout.weight_format='mxfp4'",
        ),
        (
            {"model": {"kind": "diffusion"}, "algorithm": {"name": "rldf"}},
            "lora.rank=4 is not supported with model.kind",
        ),
    ],
)
def test_lora_configs_that_cannot_run_are_refused_naming_the_key(changes, message):
    config = default_config()
    config.lora.rank = 4
    config.sft.steps = 0
    for section, values in changes.items():
        config[section].update(values)
    with pytest.raises(ValueError, match=message):
        validate_config(config)
