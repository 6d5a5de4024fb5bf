"""GRPO on Countdown: reach a target with + - * / over 4 given numbers (each at most once).

Any correct expression scores 1 (`rljax/data/tasks/countdown.py` parses it itself, exact
fractions, no eval). The tiny byte-level model is the grpo_addition one; a real run wants a
pretrained checkpoint: `--config.model.checkpoint=/path/to/hf_dir`, with
`--config.task.chat_template=True` for an instruct model.

  python -m launchers.train --config=configs/grpo_countdown.py

A curriculum from 2 numbers up to num_numbers (the task's difficulty is the count given):

  python -m launchers.train --config=configs/grpo_countdown.py --config.task.min_numbers=2 \
      --config.prompt_selection.name=curriculum --config.prompt_selection.pool_size=4096
"""

from ml_collections import ConfigDict, config_dict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/grpo_countdown"
    config.task = ConfigDict(
        dict(
            name="countdown",
            num_numbers=4,
            # None: every example has the maximum; set it for mixed levels (a curriculum).
            min_numbers=config_dict.placeholder(int),
            max_number=25,
            use_all=False,
            max_prompt_len=192,
            max_answer_len=128,
            eval_size=256,
            chat_template=False,
        )
    )
    config.rollout.max_new_tokens = 32
    return config
