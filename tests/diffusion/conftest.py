"""A tiny diffusion run shared by the engine tests: config, policy and one prompt batch."""

import dataclasses

import pytest

from configs.diffusion_lm import get_config
from rljax.data import AdditionTask, prompt_batches, prompt_dataset
from rljax.data.tasks import TASKS
from rljax.diffusion.engine import build_diffusion_policy


def tiny_config(**algorithm):
    """configs/diffusion_lm.py with a 1-layer model, 8 prompts x 2 samples (one prompt per
    device of the suite's 8 fake devices), 2 inner steps, no SFT."""
    config = get_config()
    config.model.update(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64)
    config.rollout.update(max_new_tokens=4, block_size=4, steps_per_block=2, n_samples=2)
    config.task.eval_size = 4
    config.train.update(prompts_per_step=8, learning_rate=1e-2, epochs=2)
    config.sft.steps = 0
    config.reward.kind = "inline"  # AlternatingTask counts its calls: state of this process
    config.algorithm.update(algorithm)
    return config


@pytest.fixture(name="tiny_config")
def tiny_config_fixture():
    return tiny_config


@dataclasses.dataclass
class Run:
    config: object
    tokenizer: object
    graphdef: object
    params: object
    prompts: dict
    mask_id: int


@pytest.fixture(scope="module")
def run():
    config = tiny_config()
    tokenizer, _, graphdef, params = build_diffusion_policy(config)
    data = prompt_dataset(AdditionTask(max_digits=2), "train", tokenizer, 8, seed=0)
    prompts = next(prompt_batches(data, 2))
    return Run(config, tokenizer, graphdef, params, prompts, tokenizer.vocab_size)


@dataclasses.dataclass(frozen=True)
class AlternatingTask(AdditionTask):
    """Rewards 1, 0, 1, 0, ... per call, so every group of 2 has non-zero advantages (an
    untrained model is never right)."""

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "_calls", [0])

    def reward(self, completion: str, answer: str) -> float:
        self._calls[0] += 1
        return float(self._calls[0] % 2)


@pytest.fixture
def alternating_task(monkeypatch):
    """Registers `AlternatingTask` as task.name="alternating" for the driver."""
    monkeypatch.setitem(TASKS, "alternating", AlternatingTask)
    return "alternating"
