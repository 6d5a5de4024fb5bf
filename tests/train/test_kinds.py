"""The driver's one dispatch: `model.kind` picks the builders; the loop is shared."""

from configs.diffusion_lm import get_config as diffusion_config
from configs.grpo_addition import get_config
from rljax.config import validate_config
from rljax.diffusion import engine
from rljax.diffusion.sft import diffusion_warm_start
from rljax.train import builders
from rljax.train.kinds import CAUSAL, policy_kind
from rljax.train.prompts import warm_start


def test_model_kind_picks_the_builders():
    causal = policy_kind(validate_config(get_config()))
    assert causal is CAUSAL and causal.build_policy is builders.build_policy
    assert causal.warm_start is warm_start
    diffusion = policy_kind(validate_config(diffusion_config()))
    assert diffusion.build_policy is engine.build_diffusion_policy
    assert diffusion.warm_start is diffusion_warm_start
    assert diffusion.evaluate is engine.diffusion_greedy_eval
    assert diffusion.build_collector is engine.build_diffusion_collector
