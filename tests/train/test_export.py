"""`rljax export` (rljax.train.export): a trained run's policy as a Hugging Face directory,
a PEFT adapter and a GGUF, checked against what transformers (and its GGUF reader) computes
from the files, not against our own loader alone.

Two tiny runs are trained once per module: one LoRA run from a GGUF file (the hf, peft and
gguf forms) and one full run from a Hugging Face directory (its files carried over).
"""

from __future__ import annotations

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
from flax import nnx
from launching import tiny_driver_run

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "models"))
from gguf_files import write_gguf  # noqa: E402
from hf_parity import parity, random_params, torch_or_skip  # noqa: E402

from configs.grpo_addition import get_config  # noqa: E402
from rljax.cli import main  # noqa: E402
from rljax.models import (  # noqa: E402
    ByteTokenizer,
    HFTokenizer,
    TransformerConfig,
    forward,
    gguf_tokenizer,
    load_gguf,
    positions_from_mask,
    save_hf_checkpoint,
)
from rljax.models.hf import fitting_model_type  # noqa: E402
from rljax.train.evaluation import restore_checkpoint  # noqa: E402
from rljax.train.export import export_run
from rljax.train.loop import train  # noqa: E402
from rljax.train.run_dir import stored_config  # noqa: E402

pytestmark = pytest.mark.hf
TEXTS = ["hello world", "12 + 7 = 19", "héllo 日本 🤗\n", "<|im_start|>user\nhi<|im_end|>"]


def _train(config, run_dir) -> None:
    config = tiny_driver_run(config, run_dir, steps=1)
    config.task.eval_size = 2
    list(train(config))


@pytest.fixture(scope="module")
def gguf_run(tmp_path_factory):
    """A one-step LoRA run from a tiny GGUF file, with an entropy bonus so the adapters move."""
    root = tmp_path_factory.mktemp("gguf_run")
    source = str(root / "tiny.gguf")
    write_gguf(source)
    config = get_config()
    config.model.checkpoint = source
    config.lora.update(rank=4, targets=("q", "v", "down"))
    config.algorithm.update(kl_coef=0.05, entropy_coef=0.5)
    _train(config, root / "run")
    return source, str(root / "run")


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory):
    """A one-step run that trains every weight of a tiny Qwen2 directory with a byte tokenizer
    written by ByteTokenizer.save_pretrained, and a config.json field we do not model."""
    root = tmp_path_factory.mktemp("hf_run")
    source = str(root / "source")
    model = TransformerConfig(
        vocab_size=259, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, qkv_bias=True
    )
    _, params = random_params(model)
    save_hf_checkpoint(source, model, params, "qwen2", extra_config={"max_position_embeddings": 77})
    ByteTokenizer().save_pretrained(source)
    config = get_config()
    config.model.checkpoint = source
    config.algorithm.entropy_coef = 0.5
    _train(config, root / "run")
    return source, str(root / "run")


def _policy(run_dir: str):
    """The run's newest (graphdef, merged params) as the evaluation path restores them."""
    from rljax.models.lora import merged_params

    restored = restore_checkpoint(stored_config(run_dir))
    return restored.graphdef, merged_params(restored.state), restored.state


def _hf_model(path: str, **kwargs):
    torch = torch_or_skip()
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager", **kwargs
    ).eval()


def jax_leaves(params) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(nnx.to_pure_dict(params))]


def _logits(graphdef, params, tokens: np.ndarray) -> np.ndarray:
    mask = np.ones(tokens.shape, bool)
    out, _ = forward(graphdef, params, jnp.asarray(tokens), positions_from_mask(mask), mask)
    return np.asarray(out, np.float64)


def test_hf_export_of_a_lora_run_loads_in_transformers_with_the_same_logits(gguf_run, tmp_path):
    source, run_dir = gguf_run
    assert export_run(run_dir, str(tmp_path)) == 1
    graphdef, params, _ = _policy(run_dir)
    assert parity(_hf_model(str(tmp_path)), graphdef, params) < 1e-5
    # Training moved the policy: the export is not the source checkpoint written back.
    _, base_graphdef, base = load_gguf(source)
    tokens = np.arange(12, dtype=np.int32)[None] + 5
    assert (
        np.abs(_logits(graphdef, params, tokens) - _logits(base_graphdef, base, tokens)).max()
        > 1e-4
    )
    # The GGUF's tokenizer, written as tokenizer files: same ids, specials and chat template.
    import transformers

    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    ours = gguf_tokenizer(source)
    for text in TEXTS:
        assert theirs.encode(text, add_special_tokens=False) == ours.encode(text), text
    assert (theirs.eos_token_id, theirs.pad_token_id) == (ours.eos_id, ours.pad_id)
    messages = [{"role": "user", "content": "hi"}]
    assert theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == (
        ours.apply_chat_template(messages)
    )
    with open(tmp_path / "config.json", encoding="utf-8") as f:
        assert json.load(f)["max_position_embeddings"] == 256  # the GGUF's context length


def test_peft_export_is_the_base_plus_adapters_that_merge_into_the_hf_export(gguf_run, tmp_path):
    _, run_dir = gguf_run
    export_run(run_dir, str(tmp_path / "merged"))
    export_run(run_dir, str(tmp_path / "peft"), form="peft")
    with open(tmp_path / "peft" / "adapter" / "adapter_config.json", encoding="utf-8") as f:
        adapter = json.load(f)
    assert adapter["base_model_name_or_path"] == str(tmp_path / "peft")
    base = safetensors.numpy.load_file(str(tmp_path / "peft" / "model.safetensors"))
    merged = safetensors.numpy.load_file(str(tmp_path / "merged" / "model.safetensors"))
    lora = safetensors.numpy.load_file(
        str(tmp_path / "peft" / "adapter" / "adapter_model.safetensors")
    )
    scale = adapter["lora_alpha"] / adapter["r"]
    adapted = 0
    for name, weight in merged.items():
        module = name.removesuffix(".weight")
        a = lora.get(f"base_model.model.{module}.lora_A.weight")
        expected = base[name]
        if a is not None:  # PEFT's rule: W + (alpha / r) B A
            expected = expected + scale * lora[f"base_model.model.{module}.lora_B.weight"] @ a
            adapted += 1
        np.testing.assert_allclose(weight, expected, rtol=1e-5, atol=1e-6, err_msg=name)
    assert adapted == 2 * 3  # q, v and down in each of the 2 layers
    graphdef, _, state = _policy(run_dir)  # the base directory is the frozen base
    assert parity(_hf_model(str(tmp_path / "peft")), graphdef, state.base.params) < 1e-5


def test_gguf_export_is_read_back_by_transformers_with_the_same_logits(gguf_run, tmp_path):
    import gguf

    source, run_dir = gguf_run
    export_run(run_dir, str(tmp_path), form="gguf")
    graphdef, params, _ = _policy(run_dir)
    config, _, loaded = load_gguf(str(tmp_path / "model.gguf"))
    for ours, back in zip(jax_leaves(params), jax_leaves(loaded)):
        np.testing.assert_array_equal(ours, back)  # F32: exact, q/k permuted there and back
    model = _hf_model(str(tmp_path), gguf_file="model.gguf")
    assert parity(model, graphdef, params) < 1e-5
    reader = gguf.GGUFReader(str(tmp_path / "model.gguf"))
    original = gguf.GGUFReader(source)
    assert reader.fields["tokenizer.chat_template"].contents() == (
        original.fields["tokenizer.chat_template"].contents()
    )
    export_run(run_dir, str(tmp_path / "q8"), form="gguf", gguf_type="q8_0")
    reader = gguf.GGUFReader(str(tmp_path / "q8" / "model.gguf"))
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["blk.0.attn_q.weight"] == "Q8_0" and types["blk.0.attn_norm.weight"] == "F32"
    assert reader.fields["general.file_type"].contents() == gguf.LlamaFileType.MOSTLY_Q8_0
    _, _, q8 = load_gguf(str(tmp_path / "q8" / "model.gguf"))
    for ours, back in zip(jax_leaves(params), jax_leaves(q8)):
        assert np.abs(ours - back).max() <= 0.01 * np.abs(ours).max() + 1e-7  # 8-bit blocks


def test_hf_export_keeps_a_hf_sources_family_fields_and_tokenizer_files(hf_run, tmp_path):
    source, run_dir = hf_run
    assert main(["export", run_dir, "--out", str(tmp_path)]) == 0
    with open(tmp_path / "config.json", encoding="utf-8") as f:
        hf_config = json.load(f)
    assert hf_config["model_type"] == "qwen2" and hf_config["max_position_embeddings"] == 77
    for name in ("tokenizer.json", "tokenizer_config.json"):
        with open(os.path.join(source, name), "rb") as a, open(tmp_path / name, "rb") as b:
            assert a.read() == b.read(), name
    graphdef, params, _ = _policy(run_dir)
    assert parity(_hf_model(str(tmp_path)), graphdef, params) < 1e-5


def test_byte_tokenizer_files_load_as_the_same_tokenizer(tmp_path):
    import transformers

    ours = ByteTokenizer()
    ours.save_pretrained(str(tmp_path))
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    again = HFTokenizer.from_dir(str(tmp_path))
    for text in TEXTS:
        ids = ours.encode(text)
        assert theirs.encode(text, add_special_tokens=False) == ids == again.encode(text), text
        assert theirs.decode(ids) == text
    assert (theirs.pad_token_id, theirs.bos_token_id, theirs.eos_token_id) == (256, 257, 258)
    assert (again.pad_id, again.bos_id, again.eos_id) == (256, 257, 258)
    assert theirs.decode([257, 104, 105, 258], skip_special_tokens=True) == "hi"


@pytest.mark.parametrize(
    "fields, family",
    [
        ({}, "llama"),
        ({"qkv_bias": True}, "qwen2"),
        ({"qk_norm": True}, "qwen3"),
        ({"qk_norm": True, "num_experts": 4}, "qwen3_moe"),
        ({"num_experts": 4}, "mixtral"),
        ({"sliding_window": 8}, "mistral"),
        ({"sliding_window": 8, "layer_types": ("sliding_attention", "full_attention")}, "qwen2"),
    ],
)
def test_fitting_model_type_names_the_family_that_holds_the_config(fields, family):
    config = TransformerConfig(
        vocab_size=64, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=32, **fields
    )
    assert fitting_model_type(config) == family


def test_errors_are_one_line_and_name_the_fix(gguf_run, hf_run, tmp_path, capsys):
    _, lora_run = gguf_run
    _, full_run = hf_run
    with pytest.raises(ValueError, match="lora.rank=0.*--format=hf"):
        export_run(full_run, str(tmp_path), form="peft")
    with pytest.raises(ValueError, match="not a GGUF file.*--format=hf"):
        export_run(full_run, str(tmp_path), form="gguf")
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        export_run(str(tmp_path), str(tmp_path / "out"))
    assert main(["export", lora_run, "--out", str(tmp_path), "--step", "7"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rljax export: error:")


def test_the_cli_offers_every_form_and_gguf_type(capsys):
    from rljax.models.gguf import GGUF_TYPES
    from rljax.train.export import FORMATS

    with pytest.raises(SystemExit):
        main(["export", "--help"])
    usage = " ".join(capsys.readouterr().out.split())
    assert f"--format {{{','.join(FORMATS)}}}" in usage
    assert f"--gguf-type {{{','.join(GGUF_TYPES)}}}" in usage
