"""Multi-turn RL on GuessNumber: a tiny byte-level model learns to find a secret in 1..15
within 4 guesses from "higher/lower" feedback, trained on CPU.

Each prompt is a game; its G episodes are played by the rollout engine, one decode slot each:
the model's guess (ended by EOS) is sent to the environment on a worker thread while other
slots decode, and the answer ("higher, 9 to 15") is appended to the same sequence as context
the model reads but is not trained on. The reward is 1 for a win and comes only at the end,
so GRPO's trajectory-level credit (the episode's total reward against its group's) decides
which of the turns' guesses to reinforce.

A short SFT warm start on scripted episodes of a weak player (a uniform guess inside the
stated range: it wins about 60% of games in 4 turns) teaches the format; RL then raises the
success rate towards what bisecting the range achieves (100%).

  python -m launchers.train --config=configs/agent_guess_number.py
"""

from ml_collections import ConfigDict

from rljax.config import default_config


def get_config() -> ConfigDict:
    config = default_config()
    config.run_dir = "runs/agent_guess_number"

    config.model.update(d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=384)

    # GuessNumberTask's own settings; the prompt "Guess an integer from 1 to 15.\n" is 31 bytes.
    config.task.update(name="guess_number", low=1, high=15, max_turns=4, expert="random")
    config.task.update(max_prompt_len=32, eval_size=256)
    config.env.update(chat_format="plain", time_limit_s=5.0, workers=4)
    config.sft.update(steps=300, batch_size=64, learning_rate=1e-3)
    # 4 guesses of at most 3 tokens and 3 answers of at most 18 fit in 72 columns.
    config.rollout.update(max_new_tokens=72, n_samples=8, temperature=1.0, slots=128)

    config.algorithm.update(
        name="grpo",
        clip_eps=0.2,
        clip_eps_high=0.2,
        kl_coef=0.0,
        kl_estimator="k3",
        entropy_coef=0.0,
        normalize_std=True,
        aggregation="token-mean",
    )
    config.train.update(steps=150, prompts_per_step=32, learning_rate=1e-4, eval_every=25)
    return config
