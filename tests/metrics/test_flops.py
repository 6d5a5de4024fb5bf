"""Model FLOPs of an update against the parameter count and hand formulas; the matmul probe."""

import dataclasses

from flax import nnx

from rljax.metrics.flops import MatmulProbe, block_matmul_params, model_flops
from rljax.models.config import TransformerConfig
from rljax.models.transformer import create_model

CFG = TransformerConfig(
    vocab_size=64, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=24, tie_embeddings=True
)


def block_weights(cfg: TransformerConfig) -> int:
    """Entries of the stacked blocks' matrices ([n_layers, ...] of rank > 2; norm scales are
    [n_layers, d])."""
    _, params = create_model(cfg)
    flat = nnx.to_flat_state(params)
    return sum(v[...].size for path, v in flat if path[0] == "layers" and v[...].ndim > 2)


def test_model_flops_against_parameter_count_and_hand_formula():
    layer_weights = block_weights(CFG)
    assert CFG.n_layers * block_matmul_params(CFG) == layer_weights
    f = model_flops(CFG, batch=2, prompt=3, completion=5)
    assert f["trunk"] == 6 * layer_weights * 2 * 8
    assert f["attention"] == 12 * 2 * 2 * 64 * 4 * 4  # 12 L B S^2 H hd
    assert f["head"] == 6 * 2 * 5 * 16 * 64
    assert f["model"] == f["trunk"] + f["attention"] + f["head"]
    assert f["hardware"] == f["model"] + 2 * 2 * 5 * 16 * 64


def test_an_moe_block_counts_the_router_and_the_routed_experts_only():
    moe = dataclasses.replace(CFG, num_experts=4, experts_per_token=2, expert_d_ff=8)
    per_expert = 3 * 16 * 8
    # All weights minus the experts a token does not visit (2 of 4 per layer).
    assert moe.n_layers * block_matmul_params(moe) == block_weights(moe) - 2 * 2 * per_expert


def test_the_matmul_probe_counts_its_flops():
    probe = MatmulProbe(rows=64, d_model=32, reps=3)
    assert probe.flops == 2 * 64 * 32 * 128
    assert probe.flops_per_s() > 0
