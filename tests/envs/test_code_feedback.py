"""CodeFeedback: programs run in the sandbox against the task's tests; the report a revision
reads is hand-checked, forged output does not pass, hostile programs end as errors; the
secret-constant task, its experts and the recipe's budget."""

import numpy as np
import pytest

from rljax.data.tasks.code_feedback import (
    CodeFeedbackTask,
    code_feedback_expert,
    secret_function,
)
from rljax.envs import run_episode
from rljax.envs.code_feedback import CodeFeedback
from rljax.models.tokenizer import ByteTokenizer

TASK = {
    "prompt": "Write f(x) that adds a secret number to x.",
    "tests": [["f(0)", 7], ["f(5)", 12]],
}


def scripted(*actions):
    it = iter(actions)
    return lambda observations: next(it)


def play(*actions, attempts=2):
    return run_episode(
        lambda: CodeFeedback(attempts, timeout_s=2.0),
        TASK,
        scripted(*actions),
        max_turns=attempts,
        time_limit_s=20,
    )


def test_a_revision_that_reads_the_report_passes():
    result = play("def f(x): return x+3", "```python\ndef f(x):\n    return x + 7\n```")
    (_, first), (_, second) = result.turns
    assert first.observation == "f(0) returned 3, expected 7\nf(5) returned 8, expected 12"
    assert (first.reward, first.done, first.info) == (0.0, False, {"attempt": 1})
    assert second.observation == "all tests passed"
    assert (second.reward, second.done, second.info) == (1.0, True, {"attempt": 2, "success": True})
    assert result.success and result.total_reward == 1.0


def test_the_last_failing_attempt_ends_unsuccessfully():
    result = play("def f(x): return x+3", "def f(x): return x*7")
    assert len(result.turns) == 2 and result.failure is None and not result.success
    report = "f(0) returned 0, expected 7\nf(5) returned 35, expected 12"
    assert result.turns[1][1].observation == report
    assert result.turns[1][1].info == {"attempt": 2, "success": False}


@pytest.mark.parametrize(
    "program, report",
    [
        ("def f(x) return x", "error: SyntaxError: "),
        ("def f(x): return 1 // x", "f(0) raised ZeroDivisionError"),
        ("raise ValueError('no')", "error: ValueError: no"),
        ("def g(x): return x", "f(0) raised NameError"),
        ("import sys\nsys.exit(0)", "error: no output"),
        ("while True: pass", "the program was stopped: timeout"),
        # Forged reports: a printed tag line without the nonce, and plain text.
        ('print("@@rljax-tests 0 [[\\"f(0)\\", null, null]]")\ndef f(x): return 0', "f(0) "),
        ('print("all tests passed")\ndef f(x): return 0', "f(0) returned 0, expected 7"),
    ],
)
def test_failures_are_reported_not_raised(program, report):
    result = play(program, attempts=1)
    (_, step) = result.turns[0]
    assert step.observation.startswith(report), step.observation
    assert step.reward == 0.0 and step.done and not result.success and result.failure is None


def test_reset_checks_the_tests_and_step_needs_an_episode():
    env = CodeFeedback()
    with pytest.raises(SyntaxError):
        env.reset({"prompt": "p", "tests": [["f(", 1]]})
    with pytest.raises(ValueError, match="at least one test"):
        env.reset({"prompt": "p", "tests": []})
    with pytest.raises(RuntimeError, match="reset"):
        env.step("def f(x): return x")
    with pytest.raises(ValueError, match="attempts"):
        CodeFeedback(attempts=0)


def test_task_examples_and_its_target_passes():
    task = CodeFeedbackTask()
    kinds = set()
    for i in range(30):
        ex = task.example(i, "train")
        assert (
            ex == task.example(i, "train") and ex["prompt"] == task.env_task(ex["answer"])["prompt"]
        )
        kind, secret = ex["answer"].split(";")
        kinds.add(kind)
        tests = task.env_task(ex["answer"])["tests"]
        assert tests[-1][1] == int(secret)  # the last test's value is the secret itself
        assert task.reward(task.sft_target(ex["answer"]), ex["answer"]) == 1.0
    assert kinds == {"add", "mul"}
    assert secret_function("mul", 4) == "k=4\ndef f(x): return x*k"
    assert task.env_task("mul;4")["tests"] == [["f(3)", 12], ["f(1)", 4]]
    result = run_episode(
        task.make_env,
        task.env_task("add;3"),
        scripted(task.sft_target("add;3")),
        max_turns=2,
        time_limit_s=20,
    )
    assert result.success and len(result.turns) == 1
    with pytest.raises(ValueError, match="expert kind"):
        CodeFeedbackTask(expert="oracle")


def test_experts_reader_always_wins_guesser_sometimes():
    task = CodeFeedbackTask()
    wins = {}
    for kind in ("reader", "guesser"):
        won = []
        for i in range(16):
            answer = task.example(i, "train")["answer"]
            policy = code_feedback_expert(kind, np.random.default_rng(i))
            result = run_episode(
                task.make_env, task.env_task(answer), policy, max_turns=2, time_limit_s=20
            )
            won.append(result.success)
        wins[kind] = np.mean(won)
    assert wins["reader"] == 1.0 and 0.2 < wins["guesser"] < 1.0


def test_the_recipes_scripted_episodes_fit_its_budget():
    from configs.agent_code_feedback import get_config
    from rljax.train.episodes import EpisodeSettings, scripted_episode_rows

    config = get_config()
    task = CodeFeedbackTask(max_turns=config.task.max_turns, expert="guesser")
    width = config.rollout.max_new_tokens
    rows = scripted_episode_rows(
        task, ByteTokenizer(), EpisodeSettings.from_config(config), width, 24, seed=0
    )
    used = (rows["completion_mask"] | rows["env_mask"]).sum(axis=1)
    assert used.max() <= width and (rows["env_mask"].sum(axis=1) > 0).any()
