"""The driver's training prompts from `prompt_selection`: the split, HeaPA or the curriculum."""

import pytest

from configs.grpo_addition import get_config
from rljax.data import decode_prompts
from rljax.data.selected import SelectedPromptBatches
from rljax.models.tokenizer import ByteTokenizer
from rljax.train.builders import build_task
from rljax.train.prompts import Prompts, train_prompts

PROMPTS = Prompts(ByteTokenizer(), 8, 32, None, True)


def test_the_curriculum_starts_on_the_easiest_problems():
    config = get_config()
    config.prompt_selection.update(name="curriculum", pool_size=64)
    data = train_prompts(config, build_task(config), PROMPTS)
    assert isinstance(data, SelectedPromptBatches)
    batch = next(data)
    texts = decode_prompts(batch, ByteTokenizer())
    assert len(texts) == config.train.prompts_per_step
    # min_digits=1, max_digits=2: level 0 is the problems whose operands both have 1 digit.
    assert all(len(t) == len("1+2=") for t in texts), texts


def test_a_task_without_difficulty_levels_is_named():
    config = get_config()
    config.task = {"name": "gaussian_mixture", "max_prompt_len": 192, "eval_size": 8}
    config.prompt_selection.update(name="curriculum", pool_size=64)
    with pytest.raises(ValueError, match="has no difficulty"):
        train_prompts(config, build_task(config), PROMPTS)
    config.prompt_selection.update(name="heapa", pool_size=0)
    with pytest.raises(ValueError, match="set prompt_selection.pool_size"):
        train_prompts(config, build_task(config), PROMPTS)
