"""benchmarks/compile.py: variant parsing, the medians and ratios of its table, and a smoke run
that measures a toy model in fresh processes and writes its JSON and Markdown report."""

import json
import math
import sys

import pytest

from benchmarks import compile as bench

TOY = ["--d-model=16", "--heads=2", "--kv-heads=1", "--d-ff=32", "--vocab=64"]
TOY += ["--prompt=4", "--completion=4", "--batch=2", "--group=2"]


def test_parse_variant_and_fields_this_checkout_lacks():
    assert bench.parse_variant("default") == {}
    assert bench.parse_variant("remat=block, attention_chunk=8,causal=False") == {
        "remat": "block",
        "attention_chunk": 8,
        "causal": False,
    }
    with pytest.raises(ValueError, match="not key=value"):
        bench.parse_variant("remat")
    assert bench.unknown_fields({"remat": "block", "no_such_field": 1}) == ["no_such_field"]


def run(layers_s: dict[int, list[float]]) -> dict[int, list[dict]]:
    return {
        n: [{"total_s": t, "lower_s": t / 4, "compile_s": 3 * t / 4} for t in ts]
        for n, ts in layers_s.items()
    }


def test_summary_medians_ratios_and_table():
    points = {
        "update/default": run({4: [10.0, 30.0, 20.0], 8: [40.0, 44.0, 42.0]}),
        "update/remat=block": run({4: [5.0], 8: [7.0]}),
        "update/tunix": {4: [{"error": "exit 1: ImportError: no tunix"}], 8: run({8: [21.0]})[8]},
    }
    summary = bench.summarize(points, [4, 8])
    default = summary["update/default"]
    assert default[4]["median_s"] == 20.0 and default[8]["median_s"] == 42.0
    assert default[8]["over_first"] == pytest.approx(2.1)
    assert default[8]["median_compile_s"] == pytest.approx(31.5)
    assert summary["update/tunix"][4]["median_s"] is None
    assert summary["update/tunix"][4]["errors"] == ["exit 1: ImportError: no tunix"]
    assert summary["update/tunix"][8]["over_first"] is None  # no 4-layer time to compare with

    report = json.loads(
        json.dumps(
            dict(
                layers=[4, 8],
                repeats=3,
                shape=dict(
                    d_model=128,
                    heads=4,
                    kv_heads=2,
                    d_ff=256,
                    vocab=512,
                    prompt=32,
                    completion=32,
                    batch=4,
                    group=4,
                ),
                machine=dict(processor="cpu", cpus=2),
                load_average=dict(start=[0.5, 0, 0], end=[0.7, 0, 0]),
                skipped_variants=["scan_layers=False: TransformerConfig has no field scan_layers"],
                summary=summary,
            )
        )
    )
    table = bench.markdown(report).splitlines()
    header = table[2].split(" | ")
    assert [h.strip("| ") for h in header] == [
        "layers",
        "update/default s (x 4 layers)",
        "update/remat=block s (x 4 layers)",
        "update/tunix s (x 4 layers)",
        "update/remat=block / update/default",
        "update/default / update/tunix",
        "update/remat=block / update/tunix",
    ]
    assert (
        table[4]
        == "| 4 | 20.0 (1.00x) | 5.0 (1.00x) | exit 1: ImportError: no tunix | 0.25 | - | - |"
    )
    # 7 / 42, 42 / 21 and 7 / 21; Tunix has no 4-layer time, so no growth ratio.
    assert table[5] == "| 8 | 42.0 (2.10x) | 7.0 (1.40x) | 21.0 | 0.17 | 2.00 | 0.33 |"
    assert any(line.startswith("Skipped: scan_layers=False") for line in table)


def positive(x):
    return isinstance(x, float) and math.isfinite(x) and x > 0


@pytest.mark.slow  # two fresh processes (JAX import + compile each): 54 s on a loaded machine
def test_smoke_two_layer_counts_fresh_processes(tmp_path):
    out = tmp_path / "compile.json"
    argv = ["--layers", "1", "2", "--repeats", "1", "--steps", "rollout", "--out", str(out)]
    argv += ["--variants", "default", "no_such_field=1", *TOY]
    bench.main(argv)
    report = json.loads(out.read_text())
    assert report["variants"] == ["default"]
    assert report["skipped_variants"] == [
        "no_such_field=1: TransformerConfig has no field no_such_field"
    ]
    rows = report["summary"]["rollout/default"]
    assert set(rows) == {"1", "2"}
    for row in rows.values():
        assert row["errors"] == [] and len(row["runs"]) == 1
        assert all(positive(row[k]) for k in ("median_s", "median_lower_s", "median_compile_s"))
    assert rows["2"]["params"] > rows["1"]["params"] > 0
    assert rows["1"]["over_first"] == 1.0
    assert report["compilation_cache"] == "off in every measuring process"
    table = (tmp_path / "compile.md").read_text()
    assert "| layers | rollout/default s (x 1 layers) |" in table


@pytest.mark.slow  # two toy updates + two failed Tunix starts, fresh processes: 2 min loaded
def test_update_and_a_failing_tunix_python_are_both_reported(tmp_path):
    out = tmp_path / "compile.json"
    # This venv has no tunix: the Tunix point fails, and its one-line error lands in the table.
    argv = ["--layers", "1", "2", "--repeats", "1", "--steps", "update", "--out", str(out)]
    bench.main(argv + ["--tunix-python", sys.executable, *TOY])
    report = json.loads(out.read_text())
    for n in ("1", "2"):
        assert positive(report["summary"]["update/default"][n]["median_s"])
        [error] = report["summary"]["update/tunix"][n]["errors"]
        assert error.startswith("exit 1: ") and "tunix" in error
