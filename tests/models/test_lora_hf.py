"""LoRA export (rljax.models.lora.save_peft_adapter): a PEFT adapter directory that, applied to
the saved base in transformers, gives the logits of our merged policy (and of the merged
export); checked by hand from the files and, where `peft` is installed, by PEFT itself."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
import safetensors.numpy
from hf_parity import parity, random_params, torch_or_skip

from rljax.models import TransformerConfig, lora, save_hf_checkpoint

CONFIG = TransformerConfig(
    vocab_size=96, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=96, qkv_bias=True
)
TARGETS = ("q", "v", "o", "down")
RANK, SCALE = 4, 0.5


def _exported(tmp_path, config=CONFIG, targets=TARGETS):
    """(base params, adapters, merged params) saved as tmp_path/base (HF), tmp_path/adapter
    (PEFT) and tmp_path/merged (HF)."""
    _, base = random_params(config, seed=3)
    adapters = lora.init_adapters(base, RANK, targets, jax.random.PRNGKey(0))
    keys = iter(jax.random.split(jax.random.PRNGKey(1), len(jax.tree.leaves(adapters))))
    adapters = jax.tree.map(lambda x: 0.1 * jax.random.normal(next(keys), x.shape), adapters)
    merged = lora.merge(base, adapters, SCALE)
    save_hf_checkpoint(tmp_path / "base", config, base, model_type="qwen2")
    save_hf_checkpoint(tmp_path / "merged", config, merged, model_type="qwen2")
    lora.save_peft_adapter(
        tmp_path / "adapter", config, adapters, SCALE, "qwen2", str(tmp_path / "base")
    )
    return base, adapters, merged


def _hf(path):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")
    return model.float().eval()


def test_adapter_files_have_peft_names_shapes_and_config(tmp_path):
    _, adapters, _ = _exported(tmp_path)
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == RANK
    assert config["lora_alpha"] == SCALE * RANK  # PEFT's scaling is lora_alpha / r
    assert config["target_modules"] == ["down_proj", "o_proj", "q_proj", "v_proj"]
    assert config["base_model_name_or_path"] == str(tmp_path / "base")
    tensors = safetensors.numpy.load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    assert len(tensors) == 2 * 4 * CONFIG.n_layers
    pre = "base_model.model.model.layers.1."
    q_a, q_b = (
        tensors[pre + "self_attn.q_proj.lora_A.weight"],
        tensors[pre + "self_attn.q_proj.lora_B.weight"],
    )
    assert q_a.shape == (RANK, 64) and q_b.shape == (4 * 16, RANK)  # [r, in], [out, r]
    o_a = tensors[pre + "self_attn.o_proj.lora_A.weight"]
    assert o_a.shape == (RANK, 4 * 16)  # o_proj's input is the heads' concatenation
    q = lora._flat(adapters)[("layers", "attn", "q_proj")]  # stacked: layer 1 is row 1
    np.testing.assert_array_equal(q_a, np.asarray(q["a"][1]).T)


@pytest.mark.hf
def test_base_plus_adapter_in_transformers_gives_our_merged_logits(tmp_path):
    torch = torch_or_skip()
    base, adapters, merged = _exported(tmp_path)
    graphdef, _ = random_params(CONFIG)
    # By hand from the files: W_hf += (lora_alpha / r) B A for every adapted module.
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    tensors = safetensors.numpy.load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    model = _hf(tmp_path / "base")
    weights = dict(model.named_parameters())
    with torch.no_grad():
        for name, a in tensors.items():
            if ".lora_A." not in name:
                continue
            b = tensors[name.replace(".lora_A.", ".lora_B.")]
            target = name.removeprefix(lora.PEFT_PREFIX).replace(".lora_A.weight", ".weight")
            weights[target] += torch.tensor(config["lora_alpha"] / config["r"] * (b @ a))
    assert parity(model, graphdef, merged) < 1e-5
    assert parity(_hf(tmp_path / "merged"), graphdef, merged) < 1e-5
    assert parity(_hf(tmp_path / "base"), graphdef, merged) > 1e-3  # the adapters matter


@pytest.mark.hf
def test_peft_loads_the_adapter_onto_the_base(tmp_path):
    torch_or_skip()
    peft = pytest.importorskip("peft")
    _, _, merged = _exported(tmp_path)
    graphdef, _ = random_params(CONFIG)
    model = peft.PeftModel.from_pretrained(_hf(tmp_path / "base"), tmp_path / "adapter")
    assert parity(model.eval(), graphdef, merged) < 1e-5


def test_expert_adapters_are_refused_naming_the_merged_export(tmp_path):
    config = TransformerConfig(
        vocab_size=30, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, num_experts=4
    )
    _, base = random_params(config)
    adapters = lora.init_adapters(base, 2, ("q", "up"), jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="layers/0/mlp/up_proj has no single qwen3_moe linear"):
        lora.save_peft_adapter(tmp_path, config, adapters, 1.0, "qwen3_moe")
