"""RL on a tiny masked-diffusion LM (LLaDA-style) on 1-2-digit addition, from scratch on CPU.

An SFT warm start (LLaDA's masked-token cross-entropy) teaches the answer format, then
diffu-GRPO (algorithm="diffu_grpo") or RLDF (algorithm="rldf") trains on the rewards.
Measured (`python -m scripts.compare_diffusion`, benchmarks/results/diffusion.json; one CPU
core, 1000 held-out problems, greedy, standard error ~0.011-0.014): 1700 SFT steps (~2 min)
reach 0.138 +- 0.011; 60 RL steps from that checkpoint reach 0.240 / 0.172 (diffu-GRPO, seeds
0 / 1) and 0.187 / 0.237 (RLDF), means 0.206 and 0.212: both gain ~0.07 over SFT, and the
gap between the methods is far below the seed-to-seed spread. SFT accuracy is steep in the
step count (the model "groks" addition after ~1000 steps: 1200 steps gave 0.178, 2000 steps
0.785 in a side run), and with RL learning_rate 3e-4 from the 1200-step checkpoint RL lowered
accuracy (0.178 -> 0.157 / 0.158), so treat these numbers as one configuration, not a trend.
Every field is documented in `rljax.diffusion.train.DiffusionRLConfig`, which holds the values.

  python -m rljax.diffusion.train --config=configs/diffusion_lm.py
  python -m rljax.diffusion.train --config=configs/diffusion_lm.py --config.algorithm=rldf
"""

import dataclasses

from ml_collections import ConfigDict

from rljax.diffusion.train import DiffusionRLConfig


def get_config() -> ConfigDict:
    return ConfigDict(dataclasses.asdict(DiffusionRLConfig()))
