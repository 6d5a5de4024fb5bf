"""Episodes played by the rollout engine through `EpisodeTurns`: the rows hold exactly the
sampled turns and the rendered observations a replay of the same actions gives, the batch
fields hold the replay's rewards, and environments that raise or hang end only their own
episode. `episode_row` (scripted episodes as SFT rows) against a hand-built row."""

from __future__ import annotations

import concurrent.futures
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.envs import Episode, Step, run_episode
from rljax.envs.chat import CHAT_FORMATS, ChatFormat, get_chat_format
from rljax.envs.episodes import (
    EpisodeTurns,
    episode_fields,
    episode_row,
    policy_turns,
    start_episodes,
)
from rljax.models.config import TransformerConfig
from rljax.models.tokenizer import ByteTokenizer
from rljax.models.transformer import abstract_model
from rljax.rollout.engine import Engine, EngineConfig
from rljax.rollout.sampling import SamplingParams
from rljax.rollout.turns import generate_turns

TOKENIZER = ByteTokenizer()
CHAT = CHAT_FORMATS["plain"]
CONFIG = TransformerConfig(
    vocab_size=TOKENIZER.vocab_size, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64
)
T, G, TURN = 40, 2, 3  # budget, samples per task, tokens per turn (the stop rule's cut)
RELEASE = threading.Event()  # set at the end of the module: abandoned hanging steps finish


class Counter:
    """Observation "n=<k>" after step k; reward len(action) / 10 per step; done after
    `task["steps"]` steps. Misbehaves at step `task["bad_at"]` as `task["bad"]` says."""

    def reset(self, task):
        self.task, self.k = task, 0
        return f"start {task['steps']}"

    def step(self, action):
        self.k += 1
        if self.k == self.task.get("bad_at"):
            if self.task["bad"] == "raise":
                raise RuntimeError("environment bug")
            RELEASE.wait(30)  # "hang": past the 0.5 s limit
        return Step(f"n={self.k}", len(action) / 10, self.k >= self.task["steps"], {})


TASKS = [
    {"steps": 3},
    {"steps": 1},
    {"steps": 4, "bad_at": 2, "bad": "raise"},
    {"steps": 3, "bad_at": 1, "bad": "hang"},
    {"steps": 9},  # runs out of budget
]


@pytest.fixture(scope="module")
def played():
    graphdef, shapes = abstract_model(CONFIG)
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda s: jnp.asarray(0.5 * rng.normal(size=s.shape), s.dtype), shapes)
    engine = Engine(
        graphdef,
        CONFIG,
        max_new_tokens=T,
        eos_ids=(TOKENIZER.eos_id,),
        pad_id=TOKENIZER.pad_id,
        sampling=SamplingParams(),
        engine=EngineConfig(slots=4, decode_steps=2, span_bucket=16, prefill_rows=2),
        stop=lambda seq: min(seq.size, TURN),
    )
    tasks = [task for task in TASKS for _ in range(G)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        episodes, firsts = start_episodes(Counter, tasks, pool, max_turns=6, time_limit_s=0.5)
        prompts = [TOKENIZER.encode(CHAT.render_prompt(first)) for first in firsts]
        width = max(len(p) for p in prompts)
        tokens = np.full((len(prompts), width), TOKENIZER.pad_id, np.int32)
        mask = np.zeros((len(prompts), width), bool)
        for i, p in enumerate(prompts):
            tokens[i, width - len(p) :], mask[i, width - len(p) :] = p, True
        handler = EpisodeTurns(episodes, TOKENIZER, CHAT, pool)
        out = generate_turns(engine, params, tokens, mask, jax.random.key(3), handler)
    yield jax.device_get(out), [e.result() for e in episodes], tasks
    RELEASE.set()


def runs(mask):
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(int), [0]])))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist()))


def test_rows_hold_the_actions_and_rendered_observations(played):
    out, results, tasks = played
    for row, (result, task) in enumerate(zip(results, tasks)):
        tokens = out.completion_tokens[row]
        turns = [tokens[a:b] for a, b in runs(out.completion_mask[row])]
        observations = [tokens[a:b] for a, b in runs(out.env_mask[row])]
        # Replay the decoded actions through a fresh environment: the same steps.
        actions = [TOKENIZER.decode(t) for t in turns]
        replay = Counter()
        replay.reset(task)
        steps = []
        for action in actions[: len(result.turns)]:
            steps.append(replay.step(action) if task.get("bad_at") != replay.k + 1 else None)
        assert [a for a, _ in result.turns] == actions[: len(result.turns)]
        assert [s for _, s in result.turns] == steps[: len(result.turns)]
        for got, step in zip(observations, steps):
            np.testing.assert_array_equal(
                got, TOKENIZER.encode(CHAT.render_observation(step.observation))
            )
        assert len(observations) == len(turns) - 1


def test_rewards_failures_and_containment(played):
    out, results, tasks = played
    by_task = [results[i * G : (i + 1) * G] for i in range(len(TASKS))]
    for r in by_task[0] + by_task[1]:
        assert r.failure is None
        assert r.total_reward == pytest.approx(sum(len(a) for a, _ in r.turns) / 10)
    assert [len(r.turns) for r in by_task[0]] == [3, 3]
    assert [len(r.turns) for r in by_task[1]] == [1, 1]
    assert all(r.failure == "raised" and r.total_reward == 0 for r in by_task[2])
    assert all(len(r.turns) == 1 and "environment bug" in r.error for r in by_task[2])
    assert all(r.failure == "timeout" and r.turns == [] for r in by_task[3])
    assert all(r.failure == "token_budget" and r.total_reward > 0 for r in by_task[4])
    used = (out.completion_mask | out.env_mask).sum(axis=1)
    assert (used[8:] > T - 8).all()  # the budget rows ran (nearly) to the end
    fields = episode_fields(results, out.completion_mask, max_turns=6)
    np.testing.assert_allclose(fields["rewards"], [r.total_reward for r in results])
    np.testing.assert_array_equal(fields["num_turns"], policy_turns(out.completion_mask))
    np.testing.assert_array_equal(fields["episode_success"], [1] * 4 + [0] * 6)
    for i, r in enumerate(results):
        want = [s.reward for _, s in r.turns] if r.failure in (None, "token_budget") else []
        np.testing.assert_allclose(fields["turn_rewards"][i, : len(want)], want)
        assert not fields["turn_rewards"][i, len(want) :].any()
        # Failed rows still hold the turn that failed (sampled, so trained on with reward 0).
        assert fields["num_turns"][i] >= len(r.turns) >= 0


def test_policy_turns_counts_runs():
    mask = np.array([[1, 1, 0, 1, 0, 0], [0, 0, 0, 0, 0, 0], [1, 0, 1, 0, 1, 1]], bool)
    np.testing.assert_array_equal(policy_turns(mask), [2, 0, 3])


def test_episode_row_lays_out_a_scripted_episode():
    def make_env():
        return Counter()

    result = run_episode(make_env, {"steps": 2}, lambda obs: "ab", max_turns=5, time_limit_s=5)
    row = episode_row(result, TOKENIZER, CHAT, width=16)
    eos, pad = TOKENIZER.eos_id, TOKENIZER.pad_id
    observation = list(b"\nn=1\n")
    want = [97, 98, eos, *observation, 97, 98, eos]
    np.testing.assert_array_equal(row["completion_tokens"], want + [pad] * (16 - len(want)))
    policy = [1, 1, 1] + [0] * 5 + [1, 1, 1] + [0] * 5
    np.testing.assert_array_equal(row["completion_mask"], np.asarray(policy, bool))
    env = [0, 0, 0] + [1] * 5 + [0] * 8
    np.testing.assert_array_equal(row["env_mask"], np.asarray(env, bool))
    with pytest.raises(ValueError, match="does not fit in 8 columns"):
        episode_row(result, TOKENIZER, CHAT, width=8)


def test_chat_formats():
    chatml = get_chat_format("chatml")
    assert chatml.render_prompt("hi") == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert chatml.render_observation("7").startswith("\n<|im_start|>user\n7<|im_end|>")
    with pytest.raises(ValueError, match="unknown chat format 'chatm'"):
        get_chat_format("chatm")
    with pytest.raises(ValueError, match="exactly one"):
        ChatFormat(prompt="{text}", observation="no field")


def test_episode_stop_keeps_rewards_and_refuses_error_kinds():
    episode = Episode(Counter, {"steps": 5}, max_turns=5, time_limit_s=5)
    assert episode.start() == "start 5"
    assert episode.act("abcd") == "n=1"
    episode.stop("token_budget")
    result = episode.result()
    assert (result.failure, result.total_reward, len(result.turns)) == ("token_budget", 0.4, 1)
    with pytest.raises(ValueError, match="stop kind 'raised'"):
        episode.stop("raised")
    with pytest.raises(RuntimeError, match="over"):
        episode.act("x")


def test_config_offers_every_chat_format():
    from rljax.config.schema import SCHEMA

    assert set(SCHEMA["env"]["chat_format"].choices) == set(CHAT_FORMATS)
