"""RL on a tiny masked-diffusion LM (LLaDA-style) on 1-2-digit addition, from scratch on CPU.

An SFT warm start (LLaDA's masked-token cross-entropy) teaches the answer format, then
diffu-GRPO (algorithm="diffu_grpo") or RLDF (algorithm="rldf") trains on the rewards. Measured
so far (README, "Diffusion language models"): this tiny model barely learns addition in SFT
(held-out accuracy ~0.03), so RL has almost no signal; the recipe needs tuning.
Every field is documented in `rljax.diffusion.train.DiffusionRLConfig`, which holds the values.

  python -m rljax.diffusion.train --config=configs/diffusion_lm.py
  python -m rljax.diffusion.train --config=configs/diffusion_lm.py --config.algorithm=rldf
"""

import dataclasses

from ml_collections import ConfigDict

from rljax.diffusion.train import DiffusionRLConfig


def get_config() -> ConfigDict:
    return ConfigDict(dataclasses.asdict(DiffusionRLConfig()))
