"""GRPO on ScaleLogic-style provability: facts, rules and distractors in words; "can it be
proven that ...?" answered True or False. `depth` is the exact minimal proof depth; `logic`
adds constructs: implication -> conjunction -> disjunction -> negation -> forall.

  python -m launchers.train --config=configs/grpo_logic.py
  python -m launchers.train --config=configs/grpo_logic.py --config.task.depth=5 \
      --config.task.logic=negation
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/grpo_logic"
    config.task = ConfigDict(
        dict(
            name="logic",
            depth=3,
            logic="implication",
            num_distractors=4,
            max_prompt_len=768,
            eval_size=256,
            chat_template=False,
        )
    )
    config.rollout.max_new_tokens = 8
    return config
