"""Code with execution feedback: a tiny byte-level model writes a Python function, reads what
the sandbox's tests say about it, and revises it once, trained on CPU.

Each prompt asks for f(x) that adds a secret number to x (or multiplies x by one). The prompt
does not say which number, so the first program, `k=3` then `def f(x): return x+k`, is a guess.
It runs in the sandbox (`rljax.rewards.sandbox`) against two tests; when they fail, their
report ("f(0) returned 3, expected 7 ...") is appended to the sequence as context, and the
model may write a second program. Reward 1 when a program passes, at the end. The constant
comes first so that a revision copies it from four tokens back: from the end of a one-line
program, 20 tokens back, this model never learned the copy.

The SFT warm start imitates a player who reads the report in half of its episodes and guesses
again in the other half; RL then has to learn that reading the feedback is what passes.
Measured (README, "Multi-turn agents"): sampled success 0.68 (steps 1-20) -> 0.89 (81-100),
greedy held-out success 0.957 throughout.

  python -m launchers.train --config=configs/agent_code_feedback.py
"""

from ml_collections import ConfigDict

from rljax.config import default_config


def get_config() -> ConfigDict:
    config = default_config()
    config.run_dir = "runs/agent_code_feedback"

    config.model.update(d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=384)

    # CodeFeedbackTask's own settings; the longer prompt is 49 bytes.
    config.task.update(name="code_feedback", max_turns=2, expert="guesser", timeout_s=2.0)
    config.task.update(max_prompt_len=64, eval_size=256)
    # Programs run in sandbox subprocesses, on the environment threads.
    config.env.update(chat_format="plain", time_limit_s=10.0, workers=4)
    config.sft.update(steps=600, batch_size=64, learning_rate=2e-3)
    # Two programs of about 20 bytes and their EOS, and one report of 2 lines, fit in 112.
    config.rollout.update(max_new_tokens=112, n_samples=8, temperature=1.0, slots=128)

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
    config.train.update(steps=100, prompts_per_step=16, learning_rate=1e-4, eval_every=20)
    return config
