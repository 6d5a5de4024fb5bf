"""ToolArithmetic: hand-written episodes give the hand-computed observations, rewards and
success; failed calls cost the penalty; the task's splits, round trip and experts; a scripted
episode's SFT row holds exactly the expected bytes and masks."""

import re

import numpy as np
import pytest

from rljax.data.tasks.tool_arithmetic import ToolArithmeticTask
from rljax.envs import run_episode
from rljax.envs.chat import CHAT_FORMATS
from rljax.envs.episodes import episode_fields, episode_row
from rljax.envs.tool_arithmetic import (
    ToolArithmetic,
    calculator_call,
    problem_answer,
    question_problem,
    split_problem,
    tool_arithmetic_expert,
)
from rljax.models.tokenizer import ByteTokenizer

TASK = {"question": "Ali has 626 books and gets 355 more. How many books now?", "answer": 981}
HERMES_CALL = '<tool_call>{"name":"calculator","arguments":{"expression":"626+355"}}</tool_call>'


def scripted(*actions):
    """A policy that plays `actions` in order, whatever it observes."""
    it = iter(actions)
    return lambda observations: next(it)


def play(*actions, fmt="hermes", max_turns=3):
    return run_episode(
        lambda: ToolArithmetic(fmt), TASK, scripted(*actions), max_turns=max_turns, time_limit_s=5
    )


def test_call_then_right_answer():
    result = play(HERMES_CALL, "The answer is 981.")
    (call, first), (_, last) = result.turns
    assert first.observation == "<tool_response>\n981\n</tool_response>"
    assert (first.reward, first.done, first.info) == (0.0, False, {"calls": 1, "failed_calls": 0})
    assert (last.reward, last.done, last.info) == (1.0, True, {"success": True})
    assert result.total_reward == 1.0 and result.success and result.failure is None


def test_wrong_answer_ends_the_episode_unsuccessfully():
    result = play("980")
    assert len(result.turns) == 1 and result.total_reward == 0.0
    assert result.failure is None and not result.success
    fields = episode_fields([result, play("981")], np.ones((2, 4), bool), max_turns=3)
    np.testing.assert_array_equal(fields["episode_success"], [0.0, 1.0])


@pytest.mark.parametrize(
    "bad_turn, error",
    [
        ("<tool_call>{'name': 'calculator'}</tool_call>", "hermes: "),  # not JSON
        ("<tool_call>" + HERMES_CALL[11:-12], "unclosed <tool_call>"),
        ('<tool_call>{"name":"abacus","arguments":{}}</tool_call>', "unknown tool 'abacus'"),
        ('<tool_call>{"name":"calculator","arguments":{"x":"1"}}</tool_call>', "missing required"),
        (HERMES_CALL.replace("626+355", "626+"), "calculator failed"),
    ],
)
def test_each_failed_call_costs_the_penalty(bad_turn, error):
    result = play(bad_turn, HERMES_CALL, "981")
    (_, failed), (_, ok), (_, last) = result.turns
    assert error in failed.observation and failed.reward == -0.1 and not failed.done
    assert failed.info["failed_calls"] == 1 and ok.reward == 0.0 and last.reward == 1.0
    assert result.total_reward == pytest.approx(0.9) and result.success


def test_two_calls_in_one_turn_one_bad():
    bad = HERMES_CALL.replace("626+355", "1/0")
    env = ToolArithmetic("hermes", malformed_penalty=0.25)
    env.reset(TASK)
    step = env.step(HERMES_CALL + bad)
    assert step.observation.startswith("<tool_response>\n981\n</tool_response>\n")
    assert "division by zero" in step.observation and step.reward == -0.25
    assert step.info == {"calls": 2, "failed_calls": 1}


@pytest.mark.parametrize("fmt", ["hermes", "json", "gemma"])
def test_the_expert_call_parses_in_every_format(fmt):
    result = play(calculator_call("626+355", fmt), "981", fmt=fmt)
    assert result.turns[0][1].info == {"calls": 1, "failed_calls": 0}
    assert "981" in result.turns[0][1].observation and result.success


def test_turn_limit_and_step_outside_an_episode():
    result = play(HERMES_CALL, HERMES_CALL, max_turns=2)
    assert result.failure == "turn_limit" and not result.success
    with pytest.raises(RuntimeError, match="reset"):
        ToolArithmetic().step("1")
    with pytest.raises(ValueError, match="tool_format"):
        ToolArithmetic("xml")
    with pytest.raises(ValueError, match="malformed_penalty"):
        ToolArithmetic(malformed_penalty=-1)


def test_problems_and_questions():
    assert [problem_answer(p) for p in ("626+355", "70-9", "12*11")] == [981, 61, 132]
    assert split_problem("70-9") == ("70", "-", "9")
    with pytest.raises(ValueError, match="a\\+b"):
        split_problem("-7+2")
    with pytest.raises(ValueError, match="a\\+b"):
        problem_answer("6/3")
    assert question_problem(TASK["question"]) == "626+355"
    assert question_problem("Mia buys 64 boxes of 52 cards. How many cards in all?") == "64*52"


def test_task_examples_round_trip_and_splits_are_disjoint():
    task = ToolArithmeticTask(test_size=64)
    test = {task.example(i, "test")["answer"].split(";")[0] for i in range(64)}
    train = {task.example(i, "train")["answer"].split(";")[0] for i in range(2000)}
    assert not test & train and len(train) > 1500
    widths = {}
    for i in range(300):
        ex = task.example(i, "train")
        env_task = task.env_task(ex["answer"])
        assert env_task["question"] == ex["prompt"]
        problem = question_problem(ex["prompt"])
        assert env_task["answer"] == problem_answer(problem)
        op = re.sub(r"\d", "", problem)
        shape = (re.sub(r"\d", "9", problem), len(ex["prompt"]), len(str(env_task["answer"])))
        widths.setdefault(op, set()).add(shape)
        assert task.reward(f"it is {env_task['answer']}", ex["answer"]) == 1.0
        assert task.sft_target(ex["answer"]) == str(env_task["answer"])
    # One shape per operator: operand widths, question length, a 3-digit result.
    assert widths == {
        "+": {("999+999", 56, 3)},
        "-": {("999-999", 56, 3)},
        "*": {("99*9", 52, 3)},
    }
    assert task.example(3, "train") == ToolArithmeticTask().example(3, "train")
    with pytest.raises(ValueError, match="max_turns"):
        ToolArithmeticTask(max_turns=1)
    with pytest.raises(ValueError, match="expert kind"):
        ToolArithmeticTask(expert="oracle")


@pytest.mark.parametrize("kind", ["tool", "mixed"])
def test_experts_always_win(kind):
    task = ToolArithmeticTask(expert=kind)
    turns = []
    for i in range(40):
        answer = task.example(i, "train")["answer"]
        policy = task.expert_policy(np.random.default_rng(i))
        result = run_episode(
            task.make_env, task.env_task(answer), policy, max_turns=3, time_limit_s=5
        )
        assert result.success and result.total_reward == 1.0
        turns.append(len(result.turns))
    assert set(turns) == ({2} if kind == "tool" else {1, 2})
    with pytest.raises(ValueError, match="expert kind"):
        tool_arithmetic_expert("oracle", "hermes", np.random.default_rng(0))


def test_scripted_episode_row_has_the_expected_bytes_and_masks():
    tokenizer = ByteTokenizer()
    result = play(HERMES_CALL, "981")
    row = episode_row(result, tokenizer, CHAT_FORMATS["plain"], width=140)
    observation = "\n<tool_response>\n981\n</tool_response>\n"
    eos = tokenizer.eos_id
    expected = [*HERMES_CALL.encode(), eos, *observation.encode(), *b"981", eos]
    n = len(expected)
    np.testing.assert_array_equal(row["completion_tokens"][:n], expected)
    assert (row["completion_tokens"][n:] == tokenizer.pad_id).all()
    policy = [True] * (len(HERMES_CALL) + 1) + [False] * len(observation) + [True] * 4
    np.testing.assert_array_equal(row["completion_mask"][:n], policy)
    np.testing.assert_array_equal(row["env_mask"][:n], ~np.asarray(policy))
    assert not row["completion_mask"][n:].any() and not row["env_mask"][n:].any()


def test_the_recipes_scripted_episodes_fit_its_budget():
    from configs.agent_tool_arithmetic import get_config
    from rljax.train.episodes import EpisodeSettings, scripted_episode_rows

    config = get_config()
    t = config.task
    task = ToolArithmeticTask(t.max_turns, t.tool_format, expert="tool")
    width = config.rollout.max_new_tokens
    rows = scripted_episode_rows(
        task, ByteTokenizer(), EpisodeSettings.from_config(config), width, 300, seed=0
    )
    used = (rows["completion_mask"] | rows["env_mask"]).sum(axis=1)
    assert used.max() <= width and (rows["env_mask"].sum(axis=1) > 0).all()
