"""PPO on local MBPP-style code rows with execution-aware, token-level rewards.

Each completion runs against the row's asserts in the sandbox (`rljax.rewards.sandbox`: time,
memory and output limits, no network). The reward combines syntax, tests passed, style and
security; `reward.token_level` maps it to tokens (the total on the last token, a penalty on
the tokens of the line an error points at) and GAE credits each token its own reward. The
data is yours: a JSONL/parquet/ArrayRecord file with MBPP's "text" and "test_list" columns
(and "code" for the SFT warm start). Use a pretrained checkpoint for a real run.

  python -m launchers.train --config=configs/ppo_mbpp.py \\
      --config.task.train_path=/data/mbpp/train.jsonl \\
      --config.task.test_path=/data/mbpp/test.jsonl \\
      --config.model.checkpoint=/models/qwen2.5-0.5b-instruct --config.task.chat_template=True
"""

from ml_collections import ConfigDict, config_dict

from configs.ppo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/ppo_mbpp"
    config.task = ConfigDict(
        dict(
            name="local",
            kind="code",
            train_path=config_dict.placeholder(str),
            test_path=config_dict.placeholder(str),
            code_timeout_s=2.0,
            code_memory_mb=256,
            line_penalty=0.5,
            max_prompt_len=512,
            max_answer_len=2048,
            eval_size=64,
            chat_template=False,
        )
    )
    config.rollout.max_new_tokens = 256
    config.reward.token_level = True
    config.train.prompts_per_step = 16
    return config
