"""Multi-turn episodes on the rollout engine (`rljax.rollout.turns`) against independent
references: a scripted handler's own record of the turns it was handed and the observations it
gave, and one teacher-forced forward pass over the whole episode (the trainer's view), which
the engine's appended KV must reproduce token for token.

Turns end three ways: one of several EOS ids, a stop rule that cuts every turn at 3 tokens
(the engine then rolls the slot's KV back before appending the observation), and the token
budget. The handler answers at once or after delays, so observations arrive in other rounds
than the turns that asked for them.
"""

from __future__ import annotations

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rljax.models.config import TransformerConfig
from rljax.models.transformer import abstract_model, forward, positions_from_mask
from rljax.rollout.engine import Engine, EngineConfig
from rljax.rollout.sampling import SamplingParams
from rljax.rollout.turns import generate_turns

CONFIG = TransformerConfig(
    vocab_size=50, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, qkv_bias=True
)
PAD = 0
EOS = (1, 2, 3, 4, 5)
P, T, G = 5, 24, 2
LENGTHS = (5, 3, 1, 4)
TURNS = (3, 1, 2, 8)  # turns each prompt's episodes play before the handler ends them
CUT_AT = 3  # the stop rule keeps at most 3 tokens of a turn
SMALL = EngineConfig(slots=3, decode_steps=2, span_bucket=8, prefill_rows=2)
WIDE = EngineConfig(slots=8, decode_steps=5, span_bucket=0, prefill_rows=4)
PAIR = EngineConfig(slots=2, decode_steps=1, admit_after=1, span_bucket=0, prefill_rows=1)
forward_jit = jax.jit(forward, static_argnums=0)


def prompts():
    rng = np.random.default_rng(0)
    tokens = np.zeros((len(LENGTHS), P), np.int32)
    mask = np.zeros((len(LENGTHS), P), bool)
    for i, n in enumerate(LENGTHS):
        tokens[i, P - n :] = rng.integers(6, CONFIG.vocab_size, n)
        mask[i, P - n :] = True
    return tokens, mask


def observation(row: int, turn: int) -> np.ndarray:
    """The scripted observation after `row`'s turn `turn`: 1 to 4 tokens."""
    rng = np.random.default_rng(1000 * row + turn)
    return rng.integers(6, CONFIG.vocab_size, 1 + (row + turn) % 4).astype(np.int32)


class ScriptedHandler:
    """Ends row r's episode after TURNS[r // G] turns (or when the observation does not fit);
    answers after `delays` seconds (cycled), as steps on background threads would."""

    def __init__(self, delays=(0.0,), overlap=True):
        self.delays, self.overlap = delays, overlap
        self.turns: dict[int, list[np.ndarray]] = {}
        self.rooms: dict[int, list[int]] = {}
        self.given: dict[int, list[np.ndarray]] = {}
        self.pending: list[tuple[float, int, np.ndarray | None]] = []
        self.lock = threading.Lock()
        self.calls = 0

    def end_turn(self, row, tokens, room):
        self.turns.setdefault(row, []).append(np.array(tokens))
        self.rooms.setdefault(row, []).append(room)
        k = len(self.turns[row]) - 1
        answer = None
        if k + 1 < TURNS[row // G]:
            obs = observation(row, k)
            if obs.size < room:
                answer = obs
                self.given.setdefault(row, []).append(obs)
        delay = self.delays[self.calls % len(self.delays)]
        self.calls += 1
        with self.lock:
            self.pending.append((time.monotonic() + delay, row, answer))

    def observations(self, wait):
        while True:
            now = time.monotonic()
            with self.lock:
                ready = [p for p in self.pending if p[0] <= now]
                self.pending = [p for p in self.pending if p[0] > now]
            if ready or not wait:
                return {row: answer for _, row, answer in ready}
            time.sleep(0.001)


def cut_rule(seq: np.ndarray) -> int:
    return min(seq.size, CUT_AT)


def engine(schedule):
    graphdef, _ = abstract_model(CONFIG)
    return Engine(
        graphdef,
        CONFIG,
        max_new_tokens=T,
        eos_ids=EOS,
        pad_id=PAD,
        sampling=SamplingParams(),
        engine=schedule,
        stop=cut_rule,
    )


@pytest.fixture(scope="module")
def params():
    graphdef, shapes = abstract_model(CONFIG)
    rng = np.random.default_rng(4)
    return jax.tree.map(lambda s: jnp.asarray(0.5 * rng.normal(size=s.shape), s.dtype), shapes)


@pytest.fixture(scope="module")
def episodes(params):
    """Rollouts keyed by (schedule, delays), each computed once, with their handlers."""
    cache = {}

    def run(schedule, delays=(0.0,), overlap=True):
        if (schedule, delays, overlap) not in cache:
            handler = ScriptedHandler(delays, overlap)
            tokens, mask = prompts()
            out = generate_turns(
                engine(schedule), params, tokens, mask, jax.random.key(7), handler, n_samples=G
            )
            cache[schedule, delays, overlap] = jax.device_get(out), handler
        return cache[schedule, delays, overlap]

    return run


def runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) of each run of True in a 1-D mask."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(int), [0]])))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist()))


def test_rows_hold_the_turns_and_observations_in_order(episodes):
    out, handler = episodes(SMALL, (0.0, 0.003, 0.0, 0.01))
    policy, env = out.completion_mask, out.env_mask
    assert not (policy & env).any()
    used = (policy | env).sum(axis=1)
    np.testing.assert_array_equal(policy | env, np.arange(T) < used[:, None])
    np.testing.assert_array_equal(np.where(policy | env, 0, out.completion_tokens), PAD)
    n_turns = []
    for row in range(len(LENGTHS) * G):
        tokens = out.completion_tokens[row]
        turns = [tokens[a:b] for a, b in runs(policy[row])]
        assert handler.rooms[row] == [T - b for _, b in runs(policy[row])]
        given = [tokens[a:b] for a, b in runs(env[row])]
        assert len(turns) == len(handler.turns[row]) == len(given) + 1
        for got, seen in zip(turns, handler.turns[row]):
            np.testing.assert_array_equal(got, seen)  # the handler saw each turn's tokens
            assert 1 <= got.size <= CUT_AT
            ends = got[-1] in EOS or got.size == CUT_AT
            assert ends or used[row] == T, (row, got)  # EOS, the stop rule or the budget
        for got, obs in zip(given, handler.given.get(row, [])):
            np.testing.assert_array_equal(got, obs)
        n_turns.append(len(turns))
    assert max(n_turns) >= 3 and min(n_turns) == 1
    # Some turns were cut by the stop rule (rolled back), some ended by EOS.
    ends = [t[-1] for row in handler.turns.values() for t in row]
    assert any(e in EOS for e in ends) and any(e not in EOS for e in ends)
    for name in ("sampling_logprobs", "policy_logprobs"):
        np.testing.assert_array_equal(np.where(policy, 0.0, getattr(out, name)), 0.0)


def test_policy_logprobs_equal_one_forward_over_the_episode(params, episodes):
    """The appended KV (observations written after rolled-back cuts) gives each policy token
    the log-prob of a full forward pass over prompt + every turn and observation."""
    out, _ = episodes(SMALL, (0.0, 0.003, 0.0, 0.01))
    graphdef, _ = abstract_model(CONFIG)
    tokens = np.concatenate([out.prompt_tokens, out.completion_tokens], axis=1)
    mask = np.concatenate([out.prompt_mask, out.completion_mask | out.env_mask], axis=1)
    logits = np.asarray(forward_jit(graphdef, params, tokens, positions_from_mask(mask), mask)[0])
    logp = jax.nn.log_softmax(logits[:, P - 1 : -1], axis=-1)
    picked = np.take_along_axis(np.asarray(logp), out.completion_tokens[..., None], axis=-1)
    reference = np.where(out.completion_mask, picked[..., 0], 0.0)
    np.testing.assert_allclose(out.policy_logprobs, reference, atol=2e-5, rtol=0)
    np.testing.assert_allclose(out.sampling_logprobs, reference, atol=2e-5, rtol=0)


@pytest.mark.parametrize(
    "schedule,delays,overlap",
    [
        (WIDE, (0.0,), True),
        (PAIR, (0.005, 0.0), True),
        (SMALL, (0.0,), True),
        (SMALL, (0.0, 0.003, 0.0, 0.01), False),
    ],
    ids=["8_slots", "2_slots_delayed", "3_slots_at_once", "deterministic_rounds"],
)
def test_episodes_do_not_depend_on_schedule_or_timing(episodes, schedule, delays, overlap):
    base, _ = episodes(SMALL, (0.0, 0.003, 0.0, 0.01))
    other, _ = episodes(schedule, delays, overlap)
    for name in ("completion_tokens", "completion_mask", "env_mask"):
        np.testing.assert_array_equal(getattr(other, name), getattr(base, name))
    np.testing.assert_allclose(other.policy_logprobs, base.policy_logprobs, atol=1e-5)


def test_deterministic_rounds_are_bit_identical_whatever_the_timing(episodes):
    """Without overlap the engine waits for every step of a round, so the device calls (and
    every float) do not depend on when the answers arrive."""
    base, _ = episodes(SMALL, (0.0,), False)
    for delays in [(0.0, 0.003, 0.0, 0.01), (0.01, 0.0)]:
        other, _ = episodes(SMALL, delays, False)
        for name in ("completion_tokens", "env_mask", "policy_logprobs", "sampling_logprobs"):
            np.testing.assert_array_equal(getattr(other, name), getattr(base, name))


def test_budget_ends_episodes(episodes):
    out, handler = episodes(SMALL, (0.0, 0.003, 0.0, 0.01))
    used = (out.completion_mask | out.env_mask).sum(axis=1)
    assert (used <= T).all()
    # Some episode ran out of budget: its handler saw no room left, or an observation that
    # did not fit ended it before its scripted turns.
    short = [
        r for r in handler.turns if len(handler.turns[r]) < TURNS[r // G] or 0 in handler.rooms[r]
    ]
    assert short


class BadHandler(ScriptedHandler):
    def __init__(self, answer):
        super().__init__()
        self.answer = answer

    def end_turn(self, row, tokens, room):
        self.pending.append((0.0, self.answer(row, room), np.ones(room + 1, np.int32)))


@pytest.mark.parametrize(
    "answer,match",
    [
        (lambda row, room: row, "observation of shape"),
        (lambda row, room: 10_000, "awaits no observation"),
    ],
)
def test_handler_contract_errors(params, answer, match):
    tokens, mask = prompts()
    with pytest.raises(ValueError, match=match):
        generate_turns(engine(SMALL), params, tokens, mask, jax.random.key(0), BadHandler(answer))


def test_moe_routes_of_turns_and_observations_equal_one_forward_pass():
    """An MoE episode's expert choices (routing replay) for policy and observation tokens
    alike equal those of one full forward pass over the episode; padding holds 0 .. k-1."""
    moe = CONFIG.replace(num_experts=4, experts_per_token=2)
    graphdef, shapes = abstract_model(moe)
    rng = np.random.default_rng(2)
    params = jax.tree.map(lambda s: jnp.asarray(0.5 * rng.normal(size=s.shape), s.dtype), shapes)
    run = Engine(
        graphdef,
        moe,
        max_new_tokens=T,
        eos_ids=EOS,
        pad_id=PAD,
        engine=SMALL,
        stop=cut_rule,
    )
    tokens, mask = prompts()
    out = jax.device_get(
        generate_turns(run, params, tokens, mask, jax.random.key(1), ScriptedHandler())
    )
    assert out.env_mask.any()
    full = np.concatenate([out.prompt_tokens, out.completion_tokens], axis=1)
    real = np.concatenate([out.prompt_mask, out.completion_mask | out.env_mask], axis=1)
    model = nnx.merge(graphdef, params)
    _, _, routes = model.hidden_states(
        jnp.asarray(full), positions_from_mask(real), jnp.asarray(real), None, return_routes=True
    )
    np.testing.assert_array_equal(out.routes[real], np.asarray(routes)[real])
    pad = np.broadcast_to(np.arange(2), out.routes[~real].shape)
    np.testing.assert_array_equal(out.routes[~real], pad)
