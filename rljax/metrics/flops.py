"""Model FLOPs of an update and this machine's measured matmul speed: the update's MFU.

Model FLOPs of one update, forward + backward (matmuls only: the 6 N D rule of Kaplan et al.
2020 plus the attention term of PaLM, Chowdhery et al. 2022, appendix B), with S = P + T
positions a row:
  trunk      6 * N_block * B * S          N_block: matmul weights of the decoder blocks (the
                                          routed experts only, for an MoE block)
  attention  12 * L * B * S^2 * H * hd    scores and probs @ values over the full S x S square
                                          as the model computes it (causal half not skipped)
  head       6 * B * T * d_model * V      the output matrix, on the T completion positions only
The vocabulary scan rematerialises each chunk's logits in the backward pass, so the machine does
2 * B * T * d_model * V more (`"hardware"`); MFU counts model FLOPs only (no recompute).

The peak is not a datasheet number but measured: a jitted [M, d_model] x [d_model, 4 d_model]
matmul, the shape of an MLP projection of the model, in its compute dtype (`MatmulProbe`).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp

from rljax.models.config import TransformerConfig


def block_matmul_params(cfg: TransformerConfig) -> int:
    """Weights of one decoder block that enter a token's matmuls (projections, MLP or the
    router and the routed experts; no norms)."""
    d, h, k, hd = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.resolved_head_dim
    attention = d * h * hd + 2 * d * k * hd + h * hd * d
    if cfg.num_experts:
        expert_ff = cfg.expert_d_ff or cfg.d_ff
        return attention + d * cfg.num_experts + cfg.experts_per_token * 3 * d * expert_ff
    return attention + 3 * d * cfg.d_ff


def model_flops(cfg: TransformerConfig, batch: int, prompt: int, completion: int) -> dict:
    """Matmul FLOPs of one update (forward + backward) on [batch, prompt + completion] tokens.

    Args:
      cfg: the model.
      batch, prompt, completion: B, P and T of the batch (the widths it is computed at,
        padding included).

    Returns:
      dict with "trunk", "attention", "head" (model FLOPs, see the module docstring), "model"
      (their sum) and "hardware" (model + the head's rematerialised forward).
    """
    s = prompt + completion
    trunk = 6 * cfg.n_layers * block_matmul_params(cfg) * batch * s
    attention = 12 * cfg.n_layers * batch * s * s * cfg.n_heads * cfg.resolved_head_dim
    head_forward = 2 * batch * completion * cfg.d_model * cfg.vocab_size
    head = 3 * head_forward
    model = trunk + attention + head
    return dict(
        trunk=trunk, attention=attention, head=head, model=model, hardware=model + head_forward
    )


def _timed(fn, *args) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


class MatmulProbe:
    """The reference speed: a jitted [rows, d] x [d, 4 d] matmul, its fastest of `reps` calls
    (the peak: on a shared machine the median moves with the load).

    Args:
      rows, d_model: the shape (an MLP projection of the model on a batch's tokens).
      dtype: the compute dtype (float32, or bfloat16 for a bf16 model).
      reps: timed calls per measurement.
    """

    def __init__(self, rows: int, d_model: int, dtype: str = "float32", reps: int = 10):
        keys = jax.random.split(jax.random.key(1))
        self.x = jax.random.normal(keys[0], (rows, d_model), dtype)
        self.w = jax.random.normal(keys[1], (d_model, 4 * d_model), dtype)
        self.fn = jax.jit(jnp.matmul)
        self.flops = 2 * rows * d_model * 4 * d_model
        self.reps = reps
        _timed(self.fn, self.x, self.w)  # compile

    def flops_per_s(self) -> float:
        """Matmul FLOPs per second of the fastest of `reps` calls."""
        return self.flops / min(_timed(self.fn, self.x, self.w) for _ in range(self.reps))
