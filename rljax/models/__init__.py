"""Models: the Llama/Qwen2 transformer, Hugging Face checkpoint I/O, and tokenizers."""

from rljax.models.config import TransformerConfig
from rljax.models.hf import config_from_hf, load_hf_checkpoint, save_hf_checkpoint
from rljax.models.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer, encode_prompts
from rljax.models.transformer import (
    KVCache,
    Transformer,
    abstract_model,
    create_model,
    forward,
    init_cache,
    positions_from_mask,
)

__all__ = [
    "TransformerConfig",
    "Transformer",
    "KVCache",
    "create_model",
    "abstract_model",
    "forward",
    "init_cache",
    "positions_from_mask",
    "load_hf_checkpoint",
    "save_hf_checkpoint",
    "config_from_hf",
    "ByteTokenizer",
    "HFTokenizer",
    "Tokenizer",
    "encode_prompts",
]
