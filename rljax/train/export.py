"""A training run's policy for other tools: `rljax export RUN_DIR --step N --out DIR`.

Three forms, all from the run's stored `config.json` and one of its checkpoints:

- "hf": a Hugging Face directory (config.json, model.safetensors, tokenizer files) that
  transformers' `AutoModelForCausalLM` / `AutoTokenizer` load; LoRA adapters merged in.
- "peft": for a LoRA run, the frozen base as that directory plus the adapters as a PEFT
  directory in `DIR/adapter` whose `base_model_name_or_path` is `DIR`.
- "gguf": for a run that started from a GGUF file, `DIR/model.gguf` laid out like it (same
  metadata and tokenizer), in F32, F16 or Q8_0.

The family (config.json's model_type) is the source checkpoint's when it was a Hugging Face
directory, else the one that holds the model's config (`fitting_model_type`). Tokenizer files
are copied from a Hugging Face source as they are; a GGUF's or the byte tokenizer is written
out by `save_pretrained`.
"""

from __future__ import annotations

import json
import os
import shutil

from flax import nnx
from ml_collections import ConfigDict

from rljax.models.config import TransformerConfig
from rljax.models.gguf import GGUF_TYPES, gguf_limits, save_gguf
from rljax.models.hf import (
    config_to_hf,
    fitting_model_type,
    hf_model_type,
    save_hf_checkpoint,
)
from rljax.models.int8 import dequantized
from rljax.models.lora import merged_params, save_peft_adapter
from rljax.models.tokenizer import Tokenizer
from rljax.train.builders import FETCHABLE
from rljax.train.evaluation import restore_checkpoint
from rljax.train.run_dir import stored_config

FORMATS = ("hf", "peft", "gguf")
# The tokenizer (and generation) files a Hugging Face checkpoint may carry.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
)


def _source(config: ConfigDict) -> str:
    """The path `model.checkpoint` loaded ("" for a model built from scratch)."""
    source = config.model.checkpoint
    return FETCHABLE[source]() if source in FETCHABLE else source


def _source_hf_config(source: str) -> dict | None:
    """A Hugging Face source directory's config.json (None for a GGUF file or scratch)."""
    if not os.path.isdir(source):
        return None
    with open(os.path.join(source, "config.json"), encoding="utf-8") as f:
        return json.load(f)


def _write_tokenizer(tokenizer: Tokenizer, source: str, out: str) -> None:
    """The tokenizer files: a Hugging Face source's own, else `tokenizer.save_pretrained`."""
    if os.path.isdir(source):
        for name in TOKENIZER_FILES:
            if os.path.isfile(os.path.join(source, name)):
                shutil.copyfile(os.path.join(source, name), os.path.join(out, name))
        return
    tokenizer.save_pretrained(out)


def _hf_fields(tokenizer: Tokenizer, source: str, source_hf: dict | None) -> dict:
    """config.json fields beyond the model's shape: the special token ids and a GGUF's context
    length, or a Hugging Face source's own config.json (e.g. max_position_embeddings)."""
    fields = {"eos_token_id": tokenizer.eos_id, "pad_token_id": tokenizer.pad_id}
    if tokenizer.bos_id is not None:
        fields["bos_token_id"] = tokenizer.bos_id
    if source_hf is not None:
        fields.update(source_hf)
    elif source.endswith(".gguf"):
        _, length = gguf_limits(source)
        if length is not None:
            fields["max_position_embeddings"] = length
    return fields


def write_hf_directory(
    out: str,
    model_config: TransformerConfig,
    params: nnx.State,
    tokenizer: Tokenizer,
    source: str = "",
) -> str:
    """A policy as a Hugging Face directory transformers loads: what `export_run` writes.

    Args:
      out: the directory (created if needed).
      model_config, params: the model (full weights: LoRA adapters merged in).
      tokenizer: its tokenizer, written by `save_pretrained` unless `source` has files.
      source: the checkpoint the model was loaded from ("" if built from scratch, a .gguf
        file, or a Hugging Face directory, whose family, extra config.json fields and tokenizer
        files are carried over).

    Returns:
      The model_type written.
    """
    source_hf = _source_hf_config(source)
    model_type = (source_hf and hf_model_type(source_hf)) or fitting_model_type(model_config)
    ours = config_to_hf(model_config, model_type)  # what the model itself says
    extra = {k: v for k, v in _hf_fields(tokenizer, source, source_hf).items() if k not in ours}
    save_hf_checkpoint(out, model_config, params, model_type, extra_config=extra)
    _write_tokenizer(tokenizer, source, out)
    return model_type


def export_run(
    run_dir: str,
    out: str,
    step: int | None = None,
    form: str = "hf",
    gguf_type: str = "f32",
) -> int:
    """Write a run's policy at `step` (None: the newest checkpoint) into the directory `out`.

    Args:
      run_dir: the training run's directory (config.json and checkpoints/).
      out: the output directory (created if needed; files of the same names are replaced).
      step: the checkpoint's step.
      form: "hf", "peft" or "gguf" (the module docstring says what each writes).
      gguf_type: for "gguf", the matrices' type: "f32", "f16" or "q8_0".

    Returns:
      The step exported.

    Raises:
      FileNotFoundError: no config.json or no checkpoint (at `step`) in `run_dir`.
      ValueError: an unknown form, "peft" for a run without LoRA, "gguf" for a run that did
        not start from a GGUF file, or a model no Hugging Face family holds.
    """
    if form not in FORMATS:
        raise ValueError(f"form={form!r}; use one of {FORMATS}")
    if form == "gguf" and gguf_type not in GGUF_TYPES:
        raise ValueError(f"gguf_type={gguf_type!r}; use one of {sorted(GGUF_TYPES)}")
    config = stored_config(run_dir)
    source = _source(config)
    if form == "gguf" and not source.endswith(".gguf"):
        raise ValueError(
            f"the run started from model.checkpoint={config.model.checkpoint!r}, not a GGUF "
            "file: a GGUF export copies that file's metadata and tokenizer; export the "
            "Hugging Face form (--format=hf) instead"
        )
    if form == "peft" and config.lora.rank == 0:
        raise ValueError(
            "the run trained every weight (lora.rank=0), so it has no adapters to export "
            "as PEFT; export the whole model with --format=hf"
        )
    restored = restore_checkpoint(config, step)
    os.makedirs(out, exist_ok=True)
    if form == "gguf":
        params = merged_params(restored.state)
        save_gguf(os.path.join(out, "model.gguf"), source, restored.model_config, params, gguf_type)
    elif form == "peft":
        base = restored.state.base
        model_type = write_hf_directory(
            out, restored.model_config, dequantized(base.params), restored.tokenizer, source
        )
        save_peft_adapter(
            os.path.join(out, "adapter"),
            restored.model_config,
            restored.state.params,
            base.scale,
            model_type,
            base_model_name_or_path=os.path.abspath(out),
        )
    else:
        params = merged_params(restored.state)
        write_hf_directory(out, restored.model_config, params, restored.tokenizer, source)
    return restored.step
