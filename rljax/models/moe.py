"""Mixture-of-experts SwiGLU MLP (Qwen3-MoE / Mixtral style top-k routing) with routing replay.

Each token's router logits (float32) go through a softmax over all experts; the token is sent to
its top-k experts and their SwiGLU outputs are summed with the routing weights (the k
probabilities, renormalised to sum to 1 when `norm_topk_prob`).

Routing replay (rollout routing replay, "R3"): the sampler records which experts every token
used; the trainer's forward pass is given those routes and uses the same experts, so a change
in the top-k between the inference and training passes (from numerics or from a parameter
update) cannot change which experts a token sees. Rule (interpretation of R3): with replayed
routes r, the combine weights are the CURRENT router's softmax probabilities at r, renormalised
exactly as without replay; only the discrete choice is replayed, so gradients still reach the
router through the weights (with k = 1 and renormalisation the weight is constantly 1 and the
router gets no gradient).

Dispatch is a dense one-hot combine: every token is run through every expert and the outputs
are mixed with a [B, T, E] weight matrix that is zero outside the chosen experts. This is exact,
simple and shards cleanly over an "expert" mesh axis, but costs num_experts / k times the FLOPs
of the routed computation, so it suits small models; a grouped (ragged) dispatch that only
computes the chosen experts is future work.

Parameters carry logical axes: "expert" on the expert dimension of the stacked expert weights
(mapped to the "expert" mesh axis by `rljax.parallel.rules`), "embed" and "mlp" as in the dense
MLP; the router [d_model, num_experts] is replicated over experts.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from rljax.models.config import TransformerConfig


def route(
    router_logits: jax.Array, k: int, norm_topk_prob: bool, routes: jax.Array | None = None
) -> tuple[jax.Array, jax.Array]:
    """Top-k routing (or replayed routing) from router logits.

    Args:
      router_logits: [..., E] router logits; the softmax is taken in float32.
      k: experts per token.
      norm_topk_prob: renormalise the k chosen probabilities to sum to 1.
      routes: None to choose the top-k experts by probability (ties go to the lower expert
        index, as `jax.lax.top_k` guarantees); or [..., k] int experts to use instead.

    Returns:
      weights [..., k] float32 (the current probabilities at the routes, renormalised if asked)
      and routes [..., k] int32.
    """
    probs = jax.nn.softmax(router_logits.astype(jnp.float32), axis=-1)
    if routes is None:
        _, routes = jax.lax.top_k(probs, k)
    else:
        chex.assert_shape(routes, (*router_logits.shape[:-1], k))
    routes = routes.astype(jnp.int32)
    weights = jnp.take_along_axis(probs, routes, axis=-1)
    if norm_topk_prob:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return weights, routes


def _param(rngs: nnx.Rngs, shape: tuple[int, ...], axes: tuple[str | None, ...], dtype):
    """A normal(0, 0.02) parameter with logical axis names."""
    value = 0.02 * jax.random.normal(rngs.params(), shape, dtype)
    return nnx.Param(value, out_sharding=axes, eager_sharding=False)


class MoEMLP(nnx.Module):
    """Top-k mixture of SwiGLU experts: sum_j w_j * down_e(silu(gate_e(x)) * up_e(x)), e = r_j."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        if config.num_experts < 1:
            raise ValueError(f"MoEMLP needs num_experts >= 1, got {config.num_experts}")
        d, e, f = config.d_model, config.num_experts, config.resolved_expert_d_ff
        pd = config.storage_dtype
        self.dtype = config.compute_dtype
        self.num_experts = e
        self.k = config.experts_per_token
        self.norm_topk_prob = config.norm_topk_prob
        self.router = _param(rngs, (d, e), ("embed", None), pd)
        self.gate_proj = _param(rngs, (e, d, f), ("expert", "embed", "mlp"), pd)
        self.up_proj = _param(rngs, (e, d, f), ("expert", "embed", "mlp"), pd)
        self.down_proj = _param(rngs, (e, f, d), ("expert", "mlp", "embed"), pd)

    def __call__(
        self, x: jax.Array, routes: jax.Array | None = None
    ) -> tuple[jax.Array, jax.Array]:
        """Mixes the experts' outputs for every token.

        Args:
          x: [B, T, d_model] in the compute dtype.
          routes: None to route by the router's top-k; or [B, T, k] int experts to replay.

        Returns:
          out [B, T, d_model] and the routes used [B, T, k] int32.
        """
        dt = self.dtype
        logits = x.astype(jnp.float32) @ self.router[...].astype(jnp.float32)
        weights, routes = route(logits, self.k, self.norm_topk_prob, routes)
        one_hot = jax.nn.one_hot(routes, self.num_experts, dtype=jnp.float32)  # [B, T, k, E]
        combine = jnp.einsum("btk,btke->bte", weights, one_hot).astype(dt)
        gate = jnp.einsum("btd,edf->btef", x, self.gate_proj[...].astype(dt))
        up = jnp.einsum("btd,edf->btef", x, self.up_proj[...].astype(dt))
        hidden = jax.nn.silu(gate) * up * combine[..., None]  # zero outside the chosen experts
        return jnp.einsum("btef,efd->btd", hidden, self.down_proj[...].astype(dt)), routes


def expert_load(routes: jax.Array, mask: jax.Array, num_experts: int) -> dict[str, jax.Array]:
    """How evenly tokens spread over the experts, per layer.

    Args:
      routes: [B, S, n_layers, k] int experts used (e.g. `Rollout.routes`).
      mask: [B, S] bool, the tokens to count (padding excluded).
      num_experts: E.

    Returns:
      "moe/load": [n_layers, E] float32, the fraction of the valid tokens' k routing slots that
        went to each expert (each row sums to 1; 1 / E everywhere is perfect balance);
      "moe/load_max", "moe/load_min": the largest and smallest E * load over layers and experts
        (1 = balanced; load_max = E / k means some expert got every token);
      "moe/load_cv": the coefficient of variation std_e / mean_e of the load, averaged over
        layers (0 = balanced).
      With no valid token every load is 0.
    """
    chex.assert_rank([routes, mask], [4, 2])
    chex.assert_equal_shape_prefix([routes, mask], 2)
    one_hot = jax.nn.one_hot(routes, num_experts, dtype=jnp.float32)  # [B, S, L, k, E]
    counts = jnp.einsum("bslke,bs->le", one_hot, mask.astype(jnp.float32))
    slots = jnp.sum(mask) * routes.shape[-1]
    load = counts / jnp.maximum(slots, 1)
    mean = jnp.mean(load, axis=-1)
    cv = jnp.where(mean > 0, jnp.std(load, axis=-1) / jnp.where(mean > 0, mean, 1.0), 0.0)
    return {
        "moe/load": load,
        "moe/load_max": num_experts * jnp.max(load),
        "moe/load_min": num_experts * jnp.min(load),
        "moe/load_cv": jnp.mean(cv),
    }
