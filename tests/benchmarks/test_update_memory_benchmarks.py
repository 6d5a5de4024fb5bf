"""Smoke tests of benchmarks/update.py, memory.py (at their --quick sizes) and reshard.py.

Both scripts run in-process (their programs land in the suite's persistent compilation cache,
so a repeated run mostly skips compiling) and write their JSON to a tmp dir.
"""

import json
import math

import numpy as np
import pytest

from benchmarks import memory, packing, reshard, update
from rljax.models.config import TransformerConfig


def test_memory_growth_against_hand_cases():
    linear = memory.growth([256, 512, 1024], [100.0, 200.0, 400.0])
    assert [g["ratio"] for g in linear] == [2.0, 2.0]
    assert [g["exponent"] for g in linear] == pytest.approx([1.0, 1.0])
    quad = memory.growth([10, 20, 40], [1.0, 4.0, 16.0])
    assert [g["exponent"] for g in quad] == pytest.approx([2.0, 2.0])
    assert (quad[1]["from"], quad[1]["to"]) == (20, 40)
    # Tripling T with 9x the memory is quadratic too: exponent log 9 / log 3.
    assert memory.growth([1, 3], [2.0, 18.0])[0]["exponent"] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="two or more"):
        memory.growth([1], [1.0])


def test_memory_terms_by_hand():
    cfg = TransformerConfig(vocab_size=100, d_model=8, n_layers=3, n_heads=2, n_kv_heads=1, d_ff=16)
    assert memory.attention_scores_bytes(cfg, rows=2, seq=5) == 4 * 3 * 2 * 2 * 25
    assert memory.logits_chunk_bytes(cfg, rows=2, completion=7, chunk=30) == 4 * 2 * 7 * 30
    assert memory.logits_chunk_bytes(cfg, rows=2, completion=7, chunk=500) == 4 * 2 * 7 * 100


def positive(x):
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


@pytest.mark.slow  # ~10 compilations of the update program: ~100 s with a cold cache
def test_update_quick_writes_report(tmp_path):
    out = tmp_path / "update.json"
    update.main(["--quick", "--out", str(out)])
    report = json.loads(out.read_text())
    assert {"results", "breakdown", "machine"} <= report.keys()
    assert {"processor", "cpus", "jax"} <= report["machine"].keys()
    (r,) = report["results"]
    for key in ("median_s", "completion_tokens_per_s", "total_tokens_per_s", "mfu_vs_matmul"):
        assert positive(r[key]), key
    assert positive(r["matmul_median_flops_per_s"]) and positive(r["flops"]["model"])
    assert r["total_tokens_per_s"] == pytest.approx(
        r["completion_tokens_per_s"]
        * (r["prompt_tokens"] + r["completion_tokens"])
        / r["completion_tokens"]
    )
    parts = report["breakdown"]["parts"]
    for name in ("trunk", "attention_core", "head", "optimizer"):
        assert positive(parts[name]["median_s"]), name


@pytest.mark.slow
def test_memory_quick_writes_report(tmp_path):
    out = tmp_path / "memory.json"
    memory.main(["--quick", "--out", str(out)])
    report = json.loads(out.read_text())
    assert {"results", "machine", "model"} <= report.keys()
    assert len(report["results"]) == 5
    for r in report["results"].values():
        peaks = [p["peak"] for p in r["points"]]
        assert all(positive(p) for p in peaks)
        assert [g["ratio"] for g in r["growth"]] == pytest.approx(
            [b / a for a, b in zip(peaks, peaks[1:])]
        )
        for p in r["points"]:
            assert p["peak"] == p["argument"] + p["output"] - p["alias"] + p["temp"]


def test_reshard_timing_of_a_small_model():
    out = reshard.time_reshard(64, 1, 128, sampler=4, repeats=1)
    assert out["param_bytes"] == 4 * (32000 * 64 + 4 * 64 * 64 + 3 * 64 * 128 + 3 * 64)
    assert out["seconds"] > 0 and out["gb_per_s"] > 0


def test_packing_benchmark_batch_is_ragged_within_its_bounds():
    batch = packing.ragged_batch(64, 16, 64, vocab=50)
    plen = np.asarray(batch.prompt_mask).sum(1)
    clen = np.asarray(batch.completion_mask).sum(1)
    assert plen.min() >= 4 and plen.max() <= 16 and clen.min() >= 8 and clen.max() <= 64
    assert len(set(clen.tolist())) > 10  # ragged, not constant
    assert np.asarray(batch.prompt_mask)[:, -1].all()  # left-padded prompts
