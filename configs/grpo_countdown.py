"""GRPO on Countdown: reach a target with + - * / over 4 given numbers (each at most once).

Any correct expression scores 1 (`rljax/data/tasks/countdown.py` parses it itself, exact
fractions, no eval). The tiny byte-level model is the grpo_addition one; a real run wants a
pretrained checkpoint: `--config.model.checkpoint=/path/to/hf_dir`, with
`--config.task.chat_template=True` for an instruct model.

  python -m launchers.train --config=configs/grpo_countdown.py
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/grpo_countdown"
    config.task = ConfigDict(
        dict(
            name="countdown",
            num_numbers=4,
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
