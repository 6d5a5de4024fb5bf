"""Kernel-smoothing value baseline: a leave-one-out Nadaraya-Watson regression of the reward on
prompt embeddings, which shares baseline information across similar prompts when each prompt
has few samples.

Paper: arXiv 2604.28005 (kernel smoothing for value estimation with few samples per prompt).
The estimator below is an interpretation (spec section 15, [INTERP]).
"""

import chex
import jax
import jax.numpy as jnp

from rljax.advantages.sequence import sequence_advantages
from rljax.core import keys
from rljax.core.batch import Batch
from rljax.core.transform import Metrics, Transform

EMBEDDING_KEY = "prompt_embedding"


def _check_bandwidth(bandwidth: float) -> None:
    if isinstance(bandwidth, (int, float)) and not bandwidth > 0:
        raise ValueError(
            f"bandwidth={bandwidth} must be > 0: it is the Gaussian kernel width h in "
            "embedding units (small h -> per-prompt RLOO, large h -> batch mean)"
        )


def _kernel_weights(embeddings: jax.Array, bandwidth: float) -> tuple[jax.Array, jax.Array]:
    """Leave-one-out Gaussian kernel weights, normalised over j != i in log space.

    Returns:
      w: [B, B] weights, w_ii = 0, each row summing to 1 (or all 0 if it has no neighbour).
      has_neighbour: [B] bool, False where no j != i has a finite distance (B = 1, or
        non-finite embeddings).
    """
    e = embeddings.astype(jnp.float32)
    b = e.shape[0]
    # ||e_i - e_j||^2 by direct differences (exact 0 for identical rows), reduced over D.
    d2 = jnp.sum((e[:, None, :] - e[None, :, :]) ** 2, axis=-1)  # [B, B]
    off = ~jnp.eye(b, dtype=bool) & jnp.isfinite(d2)
    d2 = jnp.where(off, d2, jnp.inf)
    nearest = jnp.min(d2, axis=1, keepdims=True)  # [B, 1], over j != i
    has_neighbour = jnp.isfinite(nearest[:, 0])
    # Shift by the nearest distance before dividing by h^2: the nearest neighbour's logit is
    # exactly 0, so the softmax never sees only -inf (no 0/0 even as h -> 0).
    shift = jnp.where(has_neighbour[:, None], nearest, 0.0)
    excess = d2 - shift  # >= 0; exactly 0 for the nearest neighbours
    # excess = 0 gives logit 0 explicitly: 0 / h would be 0 / 0 once h underflows.
    h = jnp.asarray(bandwidth, jnp.float32)
    logits = jnp.where(excess == 0, 0.0, -0.5 * (excess / h) / h)  # h^2 could over/underflow
    logits = jnp.where(off, logits, -jnp.inf)
    logits = jnp.where(has_neighbour[:, None], logits, 0.0)
    w = jax.nn.softmax(logits, axis=1)
    w = jnp.where(off & has_neighbour[:, None], w, 0.0)
    return w, has_neighbour


def kernel_baseline(
    rewards: jax.Array,
    embeddings: jax.Array,
    bandwidth: float,
    fallback_baseline: float = 0.0,
) -> jax.Array:
    """Leave-one-out Nadaraya-Watson baseline over prompt embeddings.

    V_i = sum_{j != i} K_h(e_i, e_j) r_j / sum_{j != i} K_h(e_i, e_j), with the Gaussian
    kernel K_h = exp(-||e_i - e_j||^2 / (2 h^2)), the sums running over every other sample
    of the batch (interpretation of arXiv 2604.28005, spec section 15 [INTERP]). With the
    samples of one prompt sharing an embedding, h -> 0 gives the per-prompt leave-one-out
    (RLOO) baseline and h -> inf the leave-one-out batch mean. The weights are a softmax
    over j != i of -(d2_ij - min_j d2_ij) / (2 h^2), so the nearest neighbour always keeps
    weight > 0 and no underflow to 0/0 happens for tiny h (the h -> 0 limit is the mean of
    the nearest neighbours). V_i = r_i - sum_j w_ij (r_i - r_j), so all-equal rewards give
    V = r exactly. Fallback: a sample with no other sample at finite distance (B = 1, or
    non-finite embeddings) gets V_i = `fallback_baseline` (interpretation; default 0, plain
    REINFORCE). Cost: O(B^2 D) compute, [B, B] memory after XLA fuses the reduction over D.

    Args:
      rewards: [B] sequence rewards.
      embeddings: [B, D] prompt embeddings e_i.
      bandwidth: h > 0, in embedding units.
      fallback_baseline: V of a sample with no neighbour.

    Returns:
      [B] float32 baselines V.

    Raises:
      ValueError: if bandwidth <= 0 (when it is a Python number).
    """
    chex.assert_rank(rewards, 1)
    chex.assert_rank(embeddings, 2)
    chex.assert_equal_shape_prefix([rewards, embeddings], 1)
    _check_bandwidth(bandwidth)
    r = rewards.astype(jnp.float32)
    w, has_neighbour = _kernel_weights(embeddings, bandwidth)
    adv = jnp.sum(w * (r[:, None] - r[None, :]), axis=1)  # [B], over j
    return jnp.where(has_neighbour, r - adv, fallback_baseline)


def kernel_baseline_advantages(
    bandwidth: float,
    embedding_key: str = EMBEDDING_KEY,
    fallback_baseline: float = 0.0,
) -> Transform:
    """Transform writing `batch.advantages = (r - kernel_baseline(r, e))[:, None] * mask`.

    Kernel-smoothing value baseline (arXiv 2604.28005, interpretation). The trainer puts the
    [B, D] prompt embeddings in `batch.extras[embedding_key]`: the mean of the policy's
    final hidden states over the prompt tokens. The baseline pools rewards across the whole
    batch, weighted by prompt similarity, so `group_id` is not used.

    Args:
      bandwidth: Gaussian kernel width h > 0, in embedding units.
      embedding_key: the `batch.extras` key holding the [B, D] float embeddings.
      fallback_baseline: V of a sample with no neighbour (see `kernel_baseline`).

    Returns:
      A stateless `Transform`. Metrics: "kernel_baseline/advantages/{mean,std,min,max}"
      over valid (completion_mask) tokens, "kernel_baseline/baseline_mean" (mean V over
      samples) and "kernel_baseline/effective_neighbours" (mean over samples of the Kish
      effective number 1 / sum_j w_ij^2 of neighbours pooled; 1 = nearest neighbour only,
      B - 1 = batch mean; use it to tune h).

    Raises:
      ValueError: at construction if bandwidth <= 0; at apply if rewards are not [B] or
        `batch.extras[embedding_key]` is missing or not a [B, D] float array.
    """
    _check_bandwidth(bandwidth)

    def fn(rewards: jax.Array, batch: Batch) -> tuple[jax.Array, Metrics]:
        if embedding_key not in batch.extras:
            raise ValueError(
                f"kernel_baseline_advantages needs batch.extras[{embedding_key!r}]: the [B, D] "
                "prompt embeddings (mean final hidden state over prompt tokens); have the "
                f"trainer put them there (extras has keys {sorted(batch.extras)})"
            )
        emb = jnp.asarray(batch.extras[embedding_key])
        b = rewards.shape[0]
        if emb.ndim != 2 or emb.shape[0] != b:
            raise ValueError(
                f"batch.extras[{embedding_key!r}] has shape {emb.shape}, expected [B, D] with "
                f"B = {b}: one embedding vector per sample"
            )
        if not jnp.issubdtype(emb.dtype, jnp.floating):
            raise ValueError(
                f"batch.extras[{embedding_key!r}] has dtype {emb.dtype}, expected a float dtype"
            )
        baseline = kernel_baseline(rewards, emb, bandwidth, fallback_baseline)
        adv = rewards.astype(jnp.float32) - baseline
        w, has_neighbour = _kernel_weights(emb, bandwidth)
        ess = jnp.where(has_neighbour, 1.0 / jnp.maximum(jnp.sum(w**2, axis=1), 1e-30), 0.0)
        return adv, {
            "kernel_baseline/baseline_mean": jnp.mean(baseline),
            "kernel_baseline/effective_neighbours": jnp.mean(ess),
        }

    return sequence_advantages(
        "kernel_baseline_advantages",
        fn,
        prefix="kernel_baseline",
        zero_std=False,
        reads={keys.extra(embedding_key)},
    )
