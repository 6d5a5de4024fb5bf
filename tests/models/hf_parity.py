"""Shared by the transformers-parity tests: tiny random HF models, our random params, and the
relative logits error between the two on a full and a left-padded batch."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rljax.models import TransformerConfig, abstract_model, forward, positions_from_mask

_forward = jax.jit(forward, static_argnums=0)
# model_type -> (transformers config class name, model class name)
_HF_CLASSES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM"),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
}


def torch_or_skip():
    """torch (one thread), or a skip where torch or transformers is not installed."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    torch.set_num_threads(1)
    return torch


def rel_err(ours, ref) -> float:
    """max |ours - ref| / max |ref|, in float64."""
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    return float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))


def parity_batches(vocab: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """A full batch [2, 12] and a left-padded one (3 padding tokens in row 0)."""
    tokens = np.random.default_rng(0).integers(0, vocab, (2, 12)).astype(np.int32)
    full = np.ones((2, 12), bool)
    padded = full.copy()
    padded[0, :3] = False
    return [(tokens, full), (tokens, padded)]


def hf_logits(model, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """A transformers model's float32 logits for left-padded `tokens`."""
    torch = torch_or_skip()
    positions = np.asarray(positions_from_mask(jnp.asarray(mask)))
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(tokens, dtype=torch.long),
            attention_mask=torch.tensor(mask, dtype=torch.long),
            position_ids=torch.tensor(positions, dtype=torch.long),
        )
    return out.logits.float().numpy()


def parity(model, graphdef, params) -> float:
    """Max relative logits error of ours against `model` over the real tokens of both batches."""
    worst = 0.0
    for tokens, mask in parity_batches(model.config.vocab_size):
        ref = hf_logits(model, tokens, mask)
        ours, _ = _forward(
            graphdef, params, jnp.asarray(tokens), positions_from_mask(mask), jnp.asarray(mask)
        )
        worst = max(worst, rel_err(np.asarray(ours)[mask], ref[mask]))
    return worst


def hf_model(model_type: str, fields: dict):
    """A tiny random transformers causal LM of `model_type` with config `fields`; every weight
    and bias N(0, 0.1), norm scales 1 + N(0, 0.1) (transformers initialises biases to zero and
    norms to one, which would hide mapping bugs)."""
    torch = torch_or_skip()
    import transformers

    config_name, model_name = _HF_CLASSES[model_type]
    torch.manual_seed(0)
    config = getattr(transformers, config_name)(**fields, attn_implementation="eager")
    model = getattr(transformers, model_name)(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and not name.endswith("bias"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.1)
    return model


def random_params(config: TransformerConfig, seed: int = 1) -> tuple[nnx.GraphDef, nnx.State]:
    """(graphdef, params) with N(0, 0.1) leaves, 1 + N(0, 0.1) for 1-D ones (norm scales,
    biases): built from `abstract_model` with numpy randomness, faster than `create_model`,
    and with nonzero biases (create_model zeroes them, which would hide a bias-mapping bug)."""
    graphdef, params = abstract_model(config)
    rng = np.random.default_rng(seed)

    def draw(path, s):
        rank = len(s.shape) - (path[0].key == "layers")  # of one layer of the stacked blocks
        value = 0.1 * rng.standard_normal(s.shape) + (rank == 1)
        return jnp.asarray(value.astype(np.float32)).astype(s.dtype)

    pure = jax.tree_util.tree_map_with_path(draw, nnx.to_pure_dict(params))
    nnx.replace_by_pure_dict(params, pure)
    return graphdef, params


def greedy_tokens(loaded, tokens: np.ndarray, mask: np.ndarray, new_tokens: int = 20):
    """(ours, transformers') greedy continuations of one prompt (`tokens`, `mask` [1, P],
    left-padded) from a real-file fixture with graphdef, params, hf, tok and torch."""
    from rljax.rollout.sampler import generate
    from rljax.rollout.sampling import SamplingParams

    tok, torch = loaded.tok, loaded.torch
    rollout = generate(
        loaded.graphdef,
        loaded.params,
        jnp.asarray(tokens),
        jnp.asarray(mask),
        jax.random.key(0),
        max_new_tokens=new_tokens,
        eos_id=tok.eos_id,
        pad_id=tok.pad_id,
        sampling=SamplingParams(greedy=True),
    )
    ours = np.asarray(rollout.completion_tokens[0])[np.asarray(rollout.completion_mask[0])]
    prompt = torch.tensor(tokens[:, mask[0]], dtype=torch.long)
    with torch.no_grad():
        out = loaded.hf.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            do_sample=False,
            max_new_tokens=new_tokens,
            eos_token_id=tok.eos_id,
            pad_token_id=tok.pad_id,
        )
    return ours, out[0, prompt.shape[1] :].numpy()
