"""verl 0.9.1's `core_algos` as an independent reference, run on identical inputs.

verl is installed with --no-deps (and the few small packages `core_algos` imports) into a
throwaway directory, and run in a subprocess of this Python, which has torch (the [hf]
extra). One subprocess answers a whole list of calls: importing torch and verl costs seconds.
"""

import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

# What `verl.trainer.ppo.core_algos` imports beyond torch, numpy, omegaconf and packaging.
PACKAGES = (
    "verl==0.9.1",
    "tensordict==0.15.3",
    "pyvers==0.2.3",
    "codetiming==1.4.0",
    "orjson==3.13.0",
    "importlib_metadata==10.2.0",
)
RUNNER = Path(__file__).with_name("verl_runner.py")


def install(target: Path) -> Path:
    """Installs verl and its import-time needs into `target` (no dependencies resolved)."""
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps"]
    subprocess.run([*command, "--target", str(target), *PACKAGES], check=True, timeout=600)
    return target


def run(site: Path, calls: list[dict[str, Any]], workdir: Path) -> list[dict]:
    """verl's answer to each call, by its "kind":
    "policy_loss": {"name": a registered policy loss, "config": ActorConfig fields,
      "loss_agg_mode": str, "inputs": {"old_log_prob", "log_prob", "advantages",
      "response_mask"}: float32 [B, T]} -> {"loss", "grad" (w.r.t. log_prob), "metrics"};
    "rejection": {"options": `compute_rollout_rejection_mask` keywords, "inputs": {"log_ratio",
      "response_mask"}} -> {"mask", "metrics"};
    "is_weights": the same for `compute_rollout_correction_weights` -> {"weights", "metrics"};
    "gdpo": {"inputs": {"rewards" [B, K], "response_mask" [B, T], "index" [B]}, "weights",
      "normalize_std"} -> {"advantages"} of `compute_gdpo_outcome_advantage`;
    "otb": {"inputs": {"token_rewards", "response_mask", "index", "old_log_prob",
      "sum_pi_squared"}, "multi_turn", "handle_zero_tail"} -> {"advantages"} of
      `compute_optimal_token_baseline_advantage` or its multi-turn (TIR) variant."""
    calls_path, out_path = workdir / "calls.pkl", workdir / "out.pkl"
    calls_path.write_bytes(pickle.dumps(calls))
    subprocess.run(
        [sys.executable, str(RUNNER), str(site), str(calls_path), str(out_path)],
        check=True,
        timeout=600,
    )
    return pickle.loads(out_path.read_bytes())
