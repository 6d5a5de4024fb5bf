"""KL-Cov: GRPO advantages, no ratio clipping, and a |log ratio| penalty on the tokens of
highest log-prob/advantage covariance; the addition task of grpo_addition.py.

With about 800 completion tokens per minibatch the authors' 0.2% (k_ratio 2e-3) would pick a
single token; this recipe penalises the top 2%.

python -m launchers.train --config=configs/kl_cov_addition.py
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/kl_cov_addition"
    config.algorithm = ConfigDict(dict(name="kl_cov", kl_cov_coef=1.0, k_ratio=0.02))
    return config
