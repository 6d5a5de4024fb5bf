"""The diffusion SFT warm start: EOS-padded targets, the warm-up + cosine AdamW, and a loss
that falls."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from ml_collections import ConfigDict

from rljax.diffusion.sft import make_sft_step, sft_completions, sft_optimizer


def test_sft_completions_pad_with_eos():
    tokens = np.array([[49, 57, 258, 256], [55, 258, 256, 256]])
    mask = tokens != 256
    np.testing.assert_array_equal(
        sft_completions(tokens, mask, 258), [[49, 57, 258, 258], [55, 258, 258, 258]]
    )


def test_sft_optimizer_warms_up_then_cosine_decays():
    # A constant gradient makes every Adam step -lr_i (m_hat = g, v_hat = g^2), so the updates
    # trace the schedule: lr * i / W for i < W, then lr (1 + cos(pi (i - W) / (N - W))) / 2.
    lr, warmup, n = 0.01, 4, 12
    sft = ConfigDict(dict(learning_rate=lr, warmup_steps=warmup, steps=n, weight_decay=0.0))
    opt = sft_optimizer(sft)
    params, grads = jnp.zeros(()), jnp.ones(())
    state, steps = opt.init(params), []
    for _ in range(n):
        update, state = opt.update(grads, state, params)
        steps.append(-float(update))
    i = np.arange(n)
    want = np.where(
        i < warmup, lr * i / warmup, lr * 0.5 * (1 + np.cos(np.pi * (i - warmup) / (n - warmup)))
    )
    np.testing.assert_allclose(steps, want, rtol=1e-4, atol=1e-9)
    # Decoupled weight decay pulls non-zero params towards 0 even with a zero gradient.
    sft.weight_decay = 0.5
    opt = sft_optimizer(sft)
    state = opt.init(jnp.ones(()))
    for _ in range(warmup + 1):
        update, state = opt.update(jnp.zeros(()), state, jnp.ones(()))
    np.testing.assert_allclose(float(update), -0.5 * lr, rtol=1e-4)


def test_sft_loss_decreases(run):
    batch = {
        "prompt_tokens": run.prompts["prompt_tokens"],
        "prompt_mask": run.prompts["prompt_mask"],
        "completion_tokens": np.array([[49, 57, 258, 258], [55, 258, 258, 258]], np.int32),
    }
    optimizer = optax.adam(1e-2)
    step = make_sft_step(run.graphdef, optimizer, run.mask_id, 1e-3)
    rng = jax.random.PRNGKey(3)
    p, opt_state = run.params, optimizer.init(run.params)
    losses = []  # each step returns the loss of the params it starts from, on the same masks
    for _ in range(6):
        p, opt_state, loss = step(p, opt_state, batch, rng)
        losses.append(float(loss))
    assert np.isfinite(losses[0]) and losses[-1] < losses[0] - 0.5
