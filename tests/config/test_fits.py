"""validate_config refuses a run whose prompt + completion exceed the model's context or whose
KV cache and logits cannot fit in memory, before anything is built."""

from __future__ import annotations

import os
import sys

import pytest

from configs.grpo_addition import get_config
from rljax.config import memory, validate_config
from rljax.models import create_model, save_hf_checkpoint
from rljax.models.config import TransformerConfig

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "models"))
from gguf_files import write_gguf  # noqa: E402  (the tiny GGUF writer; context_length 256)


def _error(config) -> str:
    with pytest.raises(ValueError) as err:
        validate_config(config)
    return str(err.value)


def test_absurd_max_new_tokens_is_refused_in_one_line():
    config = get_config()
    config.rollout.max_new_tokens = 10**9
    message = _error(config)
    assert "\n" not in message
    assert message.startswith("a step needs at least ")
    assert " TB " in message  # hundreds of terabytes, on any machine's memory
    assert message.endswith(
        "lower rollout.max_new_tokens, task.max_prompt_len, train.prompts_per_step or "
        "rollout.n_samples"
    )


def test_the_bound_is_the_kv_cache_plus_the_logits_chunk(monkeypatch):
    config = validate_config(get_config())
    model = TransformerConfig(
        vocab_size=300, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=64
    )
    t = config.train
    rows = t.prompts_per_step * config.rollout.n_samples
    length = config.task.max_prompt_len + config.rollout.max_new_tokens
    micro = -(-rows // (t.minibatches * t.microbatches))
    kv = 2 * 3 * rows * length * 2 * 8 * 4  # k and v, layers, rows, tokens, kv heads, width, f32
    logits = micro * config.rollout.max_new_tokens * min(300, t.vocab_chunk) * 4
    assert memory.rollout_bytes(config, model) == (kv, logits)
    # Exactly enough memory passes; one byte less is refused.
    monkeypatch.setattr(memory, "available_bytes", lambda: (kv + logits, "the host has"))
    memory.check_fits(config, model, ("the model's context length", None))
    monkeypatch.setattr(memory, "available_bytes", lambda: (kv + logits - 1, "the host has"))
    with pytest.raises(ValueError, match="a step needs at least .* but the host has"):
        memory.check_fits(config, model, ("the model's context length", None))


def test_a_gguf_files_context_length_bounds_prompt_plus_completion(tmp_path):
    path = str(tmp_path / "tiny.gguf")
    write_gguf(path)
    config = get_config()
    config.model.checkpoint = path
    config.task.max_prompt_len = 6
    config.rollout.max_new_tokens = 250  # 256 tokens fit exactly
    validate_config(config)
    config.rollout.max_new_tokens = 251
    assert _error(config) == (
        "task.max_prompt_len + rollout.max_new_tokens = 6 + 251 = 257 tokens exceed the GGUF "
        "file's context_length=256; lower one of them"
    )


def test_a_hf_checkpoint_is_sized_from_its_config_json(tmp_path, monkeypatch):
    model = TransformerConfig(
        vocab_size=64, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=32
    )
    save_hf_checkpoint(tmp_path, model, create_model(model, seed=0)[1], model_type="llama")
    config = get_config()
    config.model.checkpoint = str(tmp_path)
    validate_config(config)
    monkeypatch.setattr(memory, "available_bytes", lambda: (1000, "the 1 gpu device(s) have"))
    assert "but the 1 gpu device(s) have 1.0 kB;" in _error(config)
