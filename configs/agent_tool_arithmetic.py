"""Tool-use RL on arithmetic word problems: a tiny byte-level model learns to solve them with
a calculator tool, trained on CPU.

Each prompt is a question ("Ali has 326 books and gets 355 more. How many books now?") about
a sum or difference of 3-digit numbers or a product of a 2-digit and a 1-digit number, with a
3-digit result. The model may write a Hermes-style tool call, `<tool_call>{"name":
"calculator","arguments":{"expression":"326+355"}}</tool_call>`; the environment runs it and
appends `<tool_response>681</tool_response>` to the sequence (context the model reads but is
not trained on); a turn without a call is the final answer, rewarded 1 when right. Every
failed call costs 0.1.

The SFT warm start imitates a player who calls the calculator in half of its episodes and
answers from their head in the other half; the tiny model cannot do this arithmetic in its
head, so only calls win. Operands and results have fixed widths, so copying a number is a
lookup at a fixed distance, which the warm start teaches, roughly: after it the greedy policy
calls in 93% of the held-out problems and solves 38% of them. GRPO at temperature 0.6 (at 1.0
too many sampled calls are garbled for the groups to carry a signal, and the policy drifts
to answering without the tool) makes the copies more exact: 70-73% held-out after 100-150
steps.

  python -m launchers.train --config=configs/agent_tool_arithmetic.py
"""

from ml_collections import ConfigDict

from rljax.config import default_config


def get_config() -> ConfigDict:
    config = default_config()
    config.run_dir = "runs/agent_tool_arithmetic"

    config.model.update(d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=384)

    # ToolArithmeticTask's own settings; the longest question is 56 bytes.
    config.task.update(name="tool_arithmetic", max_turns=3, tool_format="hermes")
    config.task.update(malformed_penalty=0.1, expert="mixed")
    config.task.update(max_prompt_len=64, max_answer_len=32, eval_size=256)
    config.env.update(chat_format="plain", time_limit_s=5.0, workers=4)
    config.sft.update(steps=300, batch_size=64, learning_rate=1e-3)
    # A call (at most 81 bytes) and its EOS, the tool's response (38 with the plain layout's
    # newlines), the answer and its EOS: at most 124 columns.
    config.rollout.update(max_new_tokens=128, n_samples=8, temperature=0.6, slots=128)

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
