"""The driver's one dispatch: `model.kind` picks the builders (and a causal policy's SFT and
evaluation follow the task); the loop is shared."""

from configs.diffusion_lm import get_config as diffusion_config
from configs.grpo_addition import get_config
from rljax.config import validate_config
from rljax.data.tasks import AdditionTask
from rljax.diffusion import engine
from rljax.diffusion.sft import diffusion_warm_start
from rljax.envs.guess_number import GuessNumberTask
from rljax.train import builders, kinds
from rljax.train.kinds import CAUSAL, policy_kind


def test_model_kind_picks_the_builders():
    causal = policy_kind(validate_config(get_config()))
    assert causal is CAUSAL and causal.build_policy is builders.build_policy
    assert causal.warm_start is kinds.causal_warm_start
    assert causal.evaluate is kinds.causal_evaluate
    diffusion = policy_kind(validate_config(diffusion_config()))
    assert diffusion.build_policy is engine.build_diffusion_policy
    assert diffusion.warm_start is diffusion_warm_start
    assert diffusion.evaluate is engine.diffusion_greedy_eval
    assert diffusion.build_collector is engine.build_diffusion_collector


def test_causal_kind_plays_episodic_tasks_as_episodes(monkeypatch):
    """SFT and evaluation of a causal policy follow the task: targets and greedy answers for a
    plain task, scripted episodes and greedy episodes for an episodic one."""
    for name in ("warm_start", "episodic_warm_start", "greedy_eval", "episodic_eval"):
        monkeypatch.setattr(kinds, name, lambda *args, name=name: name)
    rest = (None,) * 3
    assert CAUSAL.warm_start(None, None, AdditionTask(), *rest, None) == "warm_start"
    assert CAUSAL.warm_start(None, None, GuessNumberTask(), *rest, None) == "episodic_warm_start"
    assert CAUSAL.evaluate(None, None, AdditionTask(), *rest) == "greedy_eval"
    assert CAUSAL.evaluate(None, None, GuessNumberTask(), *rest) == "episodic_eval"
