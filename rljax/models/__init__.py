"""Models: the Llama/Qwen2 transformer, Hugging Face and GGUF checkpoint I/O, and tokenizers."""

from rljax.models.attention import ATTENTION_IMPLS, attend
from rljax.models.config import TransformerConfig
from rljax.models.fetch import fetch_gemma3, fetch_smollm2
from rljax.models.gguf import gguf_config, load_gguf
from rljax.models.gguf_tokenizer import GGUFTokenizer, gguf_tokenizer
from rljax.models.hf import config_from_hf, load_hf_checkpoint, save_hf_checkpoint
from rljax.models.lora import save_peft_adapter
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
    "ATTENTION_IMPLS",
    "attend",
    "Transformer",
    "KVCache",
    "create_model",
    "abstract_model",
    "forward",
    "init_cache",
    "positions_from_mask",
    "load_hf_checkpoint",
    "save_hf_checkpoint",
    "save_peft_adapter",
    "config_from_hf",
    "load_gguf",
    "gguf_config",
    "gguf_tokenizer",
    "GGUFTokenizer",
    "fetch_smollm2",
    "fetch_gemma3",
    "ByteTokenizer",
    "HFTokenizer",
    "Tokenizer",
    "encode_prompts",
]
