"""benchmarks/engine_workload.py: the shared workload's prompts (with a byte tokenizer that has a
toy chat template), the JSON the vLLM side reads, and smollm2.py's padded batch of the same ids.
The SmolLM2 export itself is checked by running the module (it needs the real model)."""

import json

import numpy as np

from benchmarks import engine_workload, smollm2
from rljax.data.tasks import WordProblemTask
from rljax.models.tokenizer import ByteTokenizer


class ChatBytes(ByteTokenizer):
    """ByteTokenizer plus a ChatML-like template, standing in for the GGUF tokenizer."""

    def apply_chat_template(self, messages):
        turns = "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages)
        return turns + "<assistant>"


def test_prompts_are_the_chat_formatted_test_problems_without_bos(tmp_path):
    tok = ChatBytes()
    prompts = engine_workload.workload_prompts(tok, n_prompts=3)
    task = WordProblemTask()
    for i, ids in enumerate(prompts):
        text = f"<user>{task.example(i, 'test')['prompt']}</user><assistant>"
        assert ids == tok.encode(text) and tok.bos_id not in ids
    assert len({len(p) for p in engine_workload.workload_prompts(tok, 8)}) > 1  # ragged

    path = tmp_path / "w.json"
    engine_workload.write_prompts(str(path), prompts, eos_id=tok.eos_id)
    assert json.loads(path.read_text()) == {"eos_id": tok.eos_id, "prompt_token_ids": prompts}


def test_smollm2_benchmark_pads_the_same_ids():
    tok = ChatBytes()
    tokens, mask = smollm2.prompts(tok, 4)
    for row, ids in zip(tokens, engine_workload.workload_prompts(tok, 4)):
        assert row[-len(ids) :].tolist() == ids
        assert np.all(row[: len(row) - len(ids)] == tok.pad_id)
    assert mask.sum(1).tolist() == [len(p) for p in engine_workload.workload_prompts(tok, 4)]
