#!/usr/bin/env bash
# The benchmarks on one NVIDIA GPU: benchmarks.rollout, benchmarks.update and benchmarks.peers
# (rljax against HF transformers + a TRL-style GRPO loss in torch, torch on cuda), GPU-sized,
# in under 8 minutes in all.
#
# UNTESTED: written in a session without a GPU; no run of it has been seen yet.
#
# Run from the repository root:  bash benchmarks/gpu.sh
# Results go to $OUT (set by the device tool) or else benchmarks/results/gpu/, with gpu.log.
#
# Python: the project's .venv holds CPU jax and CPU torch, so this script does not use it. It
# takes $PYTHON, else the machine's python3 (the lent H200 image has CUDA jax, CUDA torch,
# transformers, flax, optax, chex and orbax, and no package registry). Packages rljax imports
# that such an image lacks (grain, array-record, ml-collections, portpicker, ...) travel as
# wheels in .whl/ (see /work/.library/device/README.md for `pip download` of cp312 manylinux
# wheels); they are installed here with --no-index into /tmp/site. On a machine that can reach
# PyPI instead: python3 -m venv /tmp/gpuvenv && /tmp/gpuvenv/bin/pip install -U "jax[cuda12]"
# torch transformers -e . && PYTHON=/tmp/gpuvenv/bin/python bash benchmarks/gpu.sh
# Tunix is not run here: it needs its own environment (benchmarks/peers.py --tunix_python).
set -euo pipefail

PYTHON=${PYTHON:-python3}
RESULTS=${OUT:-benchmarks/results/gpu}
mkdir -p "$RESULTS"
export PYTHONUNBUFFERED=1

if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  "$PYTHON" - <<'EOF'
import jax, torch, transformers
print("jax", jax.__version__, jax.devices())
print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "transformers",
      transformers.__version__)
assert jax.default_backend() == "gpu", "jax sees no GPU: install a CUDA jax first"
import rljax.models.hf, rljax.rollout.sampler, rljax.train.steps  # noqa: F401  (imports work)
EOF

  # rljax rollout alone (benchmarks.rollout keeps HF on the CPU; peers below runs it on cuda):
  # 8 layers, 64 prompts, 64 + 256 tokens, bf16 compute.
  timeout 150 "$PYTHON" -m benchmarks.rollout --layers 8 --batch 64 --new_tokens 256 \
    --dtype bfloat16 --skip_hf --out "$RESULTS/rollout.json" || echo "FAILED: rollout"

  # update throughput and MFU (its own fixed sizes; quick on a GPU).
  timeout 150 "$PYTHON" -m benchmarks.update --out "$RESULTS/update.json" || echo "FAILED: update"

  # side by side: rollout 128 x (64 + 128), update 16 prompts x 4 x (64 + 128), bf16 compute.
  timeout 150 "$PYTHON" -m benchmarks.peers --dtype bfloat16 --scale 8 \
    --out "$RESULTS/peers.json" || echo "FAILED: peers"
} 2>&1 | tee "$RESULTS/gpu.log"
