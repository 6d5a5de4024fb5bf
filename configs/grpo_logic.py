"""GRPO on ScaleLogic-style provability: facts, rules and distractors in words; "can it be
proven that ...?" answered True or False. `depth` is the exact minimal proof depth; `logic`
adds constructs: implication -> conjunction -> disjunction -> negation -> forall.

  python -m launchers.train --config=configs/grpo_logic.py
  python -m launchers.train --config=configs/grpo_logic.py --config.task.depth=5 \
      --config.task.logic=negation

A curriculum over proof depths 1..depth (the task's difficulty is the depth):

  python -m launchers.train --config=configs/grpo_logic.py --config.task.min_depth=1 \
      --config.prompt_selection.name=curriculum --config.prompt_selection.pool_size=4096
"""

from ml_collections import ConfigDict, config_dict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/grpo_logic"
    config.task = ConfigDict(
        dict(
            name="logic",
            depth=3,
            # None: every example has the maximum; set it for mixed levels (a curriculum).
            min_depth=config_dict.placeholder(int),
            logic="implication",
            num_distractors=4,
            max_prompt_len=768,
            eval_size=256,
            chat_template=False,
        )
    )
    config.rollout.max_new_tokens = 8
    return config
