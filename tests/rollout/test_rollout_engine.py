"""Rollout engine (`rljax.rollout.engine`) against independent references: the static sampler
(`rljax.rollout.sampler.generate`) for greedy decoding, teacher-forced full forward passes for
log-probs, numpy truncation for EOS ids, budgets and stop rules.

Every run uses the same tiny model and the same [5, 5] prompts with 2 samples each (10 rows,
8 new tokens), so the engine's jitted steps compile once per schedule and are shared by the
tests. `_record` wraps the engine's device steps to check that a test really exercised what it
claims (several admission rounds, several decode spans, cuts inside a decode call).
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rljax.rollout.engine as engine_lib
from rljax.models.config import TransformerConfig
from rljax.models.transformer import abstract_model, forward, positions_from_mask
from rljax.rollout.engine import Engine, EngineConfig
from rljax.rollout.sampler import generate
from rljax.rollout.sampling import SamplingParams

CONFIG = TransformerConfig(
    vocab_size=50, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, qkv_bias=True
)
MOE = CONFIG.replace(num_experts=4, experts_per_token=2)
PAD = 0
LENGTHS = (5, 3, 1, 4, 2)  # ragged, left-padded to P; prompt 2 has a single token
P, T, G = 5, 8, 2
GREEDY = SamplingParams(greedy=True)
SAMPLED = SamplingParams()  # temperature 1: log-probs are the policy's
SAMPLED_EOS = (1, 2, 3)  # three EOS ids: sampled rows stop at different steps
BUDGETS = (8, 3, 8, 1, 6)  # per-prompt max_new_tokens

# Schedules (execution only). SMALL: 3 slots for 10 rows, 3 tokens per call, spans of 4, so
# the queue drains over several admission rounds and several spans; WIDE: more slots than
# rows, whole-cache attention; PAIR and TRIO: other slot counts, admission thresholds,
# decode lengths, span buckets and prefill batches.
SMALL = EngineConfig(slots=3, decode_steps=3, span_bucket=4, prefill_rows=4)
WIDE = EngineConfig(slots=16, decode_steps=3, span_bucket=0, prefill_rows=4)
PAIR = EngineConfig(slots=2, decode_steps=1, admit_after=1, span_bucket=0, prefill_rows=1)
TRIO = EngineConfig(slots=3, decode_steps=4, admit_after=2, span_bucket=0, prefill_rows=1)
forward_jit = jax.jit(forward, static_argnums=0)


def prompts():
    """[5, P] left-padded prompts of lengths LENGTHS."""
    rng = np.random.default_rng(0)
    tokens = np.zeros((len(LENGTHS), P), np.int32)
    mask = np.zeros((len(LENGTHS), P), bool)
    for i, n in enumerate(LENGTHS):
        tokens[i, P - n :] = rng.integers(4, CONFIG.vocab_size, n)
        mask[i, P - n :] = True
    return tokens, mask


def random_params(config, seed=0, scale=0.5):
    """N(0, scale^2) weights: far from flat, so CUTS candidate sets have several sizes."""
    graphdef, shapes = abstract_model(config)
    rng = np.random.default_rng(seed)
    draw = lambda s: jnp.asarray(scale * rng.normal(size=s.shape), s.dtype)  # noqa: E731
    return graphdef, jax.tree.map(draw, shapes)


@pytest.fixture(scope="module")
def model():
    return random_params(CONFIG, seed=4, scale=0.5)


def _record(engine, params, key, **kwargs):
    """`engine.generate` on `prompts()`, with a log of its device steps: decode spans, the
    output rows of every admission round, each cut's (kept, decoded) token counts and the slot
    counts the tail shrank to."""
    log = {"spans": [], "admitted": [], "cuts": [], "shrunk": []}
    decode, admit, cut = engine_lib._decode, engine_lib._admit, engine_lib._cut
    take_slots = engine_lib._take_slots

    def spy_take_slots(slots, keep):
        assert np.asarray(slots.live)[np.asarray(keep)].sum() == np.asarray(slots.live).sum()
        log["shrunk"].append(int(keep.shape[0]))
        return take_slots(slots, keep)

    def spy_decode(*args, **kw):
        log["spans"].append(kw["span"])
        return decode(*args, **kw)

    def spy_admit(slots, outputs, prefixes, slot_ids, src, rows, *rest):
        real = np.asarray(slot_ids) < np.asarray(slots.live).shape[0]
        log["admitted"].append(np.asarray(rows)[real].tolist())
        return admit(slots, outputs, prefixes, slot_ids, src, rows, *rest)

    def spy_cut(slots, outputs, slot_ids, rows, keep, pad_id):
        decoded = np.asarray(outputs.mask)[np.asarray(rows)].sum(axis=1)
        log["cuts"].extend(zip(np.asarray(keep).tolist(), decoded.tolist(), strict=True))
        return cut(slots, outputs, slot_ids, rows, keep, pad_id)

    tokens, mask = prompts()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(engine_lib, "_decode", spy_decode)
        patch.setattr(engine_lib, "_admit", spy_admit)
        patch.setattr(engine_lib, "_cut", spy_cut)
        patch.setattr(engine_lib, "_take_slots", spy_take_slots)
        out = engine.generate(params, tokens, mask, key, n_samples=G, **kwargs)
    return jax.device_get(out), log


def _engine(sampling, schedule, eos_ids, config=CONFIG, stop=None):
    graphdef, _ = abstract_model(config)
    return Engine(
        graphdef,
        config,
        max_new_tokens=T,
        eos_ids=eos_ids,
        pad_id=PAD,
        sampling=sampling,
        engine=schedule,
        stop=stop,
    )


def _static(graphdef, params, sampling, eos_id, seed=0):
    tokens, mask = prompts()
    out = generate(
        graphdef,
        params,
        jnp.asarray(tokens),
        jnp.asarray(mask),
        jax.random.key(seed),
        max_new_tokens=T,
        eos_id=eos_id,
        pad_id=PAD,
        n_samples=G,
        sampling=sampling,
    )
    return jax.device_get(out)


def stop_lengths(tokens, eos_ids, budgets=None):
    """[N] tokens each row keeps: through its first EOS, at most its budget (numpy)."""
    hit = np.isin(tokens, eos_ids)
    n = np.where(hit.any(axis=1), hit.argmax(axis=1) + 1, tokens.shape[1])
    return n if budgets is None else np.minimum(n, budgets)


def assert_truncated(out, reference, keep):
    """`out` holds the first `keep` [N] tokens of `reference`'s rows, then padding."""
    kept = np.arange(T) < keep[:, None]
    np.testing.assert_array_equal(out.completion_mask, kept)
    np.testing.assert_array_equal(
        out.completion_tokens, np.where(kept, reference.completion_tokens, PAD)
    )
    for name in ("sampling_logprobs", "policy_logprobs"):
        want = np.where(kept, getattr(reference, name), 0.0)
        np.testing.assert_allclose(getattr(out, name), want, atol=1e-5, rtol=0)


def teacher_forced_logits(graphdef, params, out):
    """Float32 logits [N, T, V] predicting each completion token, from one full forward pass
    over prompt + completion (the trainer's view)."""
    tokens = np.concatenate([out.prompt_tokens, out.completion_tokens], axis=1)
    mask = np.concatenate([out.prompt_mask, out.completion_mask], axis=1)
    logits = forward_jit(graphdef, params, tokens, positions_from_mask(mask), mask)[0]
    return np.asarray(logits)[:, P - 1 : -1]


def take(x, tokens):
    return np.take_along_axis(x, np.asarray(tokens)[..., None], axis=-1)[..., 0]


# --- greedy decoding equals the static sampler ------------------------------------------


@pytest.fixture(scope="module")
def greedy_reference(model):
    """The static sampler's greedy rows without EOS, an EOS id that stops prompts at
    different steps (and leaves some running to T), and its rows with that EOS."""
    graphdef, params = model
    free = _static(graphdef, params, GREEDY, eos_id=-1)
    best = None
    for eos in np.unique(free.completion_tokens):
        n = stop_lengths(free.completion_tokens, [eos])
        score = (len(set(n.tolist())), -int(eos))
        if (n == T).any() and (n < T).sum() >= 4 and (best is None or score > best[0]):
            best = score, int(eos)
    assert best is not None and best[0][0] >= 3, "no EOS id stops rows at different steps"
    eos = best[1]
    return free, eos, _static(graphdef, params, GREEDY, eos_id=eos)


@pytest.mark.parametrize("schedule", [SMALL, WIDE], ids=["3_slots", "16_slots"])
def test_greedy_equals_static_sampler(model, greedy_reference, schedule):
    graphdef, params = model
    free, eos, reference = greedy_reference
    out, log = _record(_engine(GREEDY, schedule, (eos,)), params, jax.random.key(0))
    n = stop_lengths(free.completion_tokens, [eos])
    assert len(set(n.tolist())) >= 3  # rows stop at different steps, some run to T
    np.testing.assert_array_equal(reference.completion_mask.sum(axis=1), n)
    np.testing.assert_array_equal(out.completion_tokens, reference.completion_tokens)
    np.testing.assert_array_equal(out.completion_mask, reference.completion_mask)
    np.testing.assert_array_equal(out.sampling_logprobs, 0.0)
    np.testing.assert_allclose(out.policy_logprobs, reference.policy_logprobs, atol=1e-5, rtol=0)
    for name in ("prompt_tokens", "prompt_mask", "group_id", "cuts_rows"):
        np.testing.assert_array_equal(getattr(out, name), getattr(reference, name))
    assert out.routes is None and reference.routes is None
    admitted = sorted(itertools.chain.from_iterable(log["admitted"]))
    assert admitted == list(range(len(LENGTHS) * G))  # every request admitted exactly once
    if schedule is SMALL:  # the queue drained through the 3 slots, over several spans
        assert len(log["admitted"]) >= 4 and max(map(len, log["admitted"])) <= 3
        assert len(set(log["spans"])) >= 3 and max(log["spans"]) <= P + T
    else:  # everything fits at once; the tail halves the 10 slots as rows stop
        assert len(log["admitted"]) == 1 and set(log["spans"]) == {P + T}
        assert (
            log["shrunk"] and log["shrunk"][0] == 5 and log["shrunk"] == sorted(log["shrunk"])[::-1]
        )


def test_several_eos_ids_and_per_prompt_budgets(model, greedy_reference):
    """Rows stop at whichever EOS id comes first or at their prompt's budget (numpy
    truncation of the static sampler's EOS-free greedy rows)."""
    graphdef, params = model
    free = greedy_reference[0]
    budgets = np.array([T, 3, 5, T, 2])
    row_budgets = np.repeat(budgets, G)
    ids = np.unique(free.completion_tokens).tolist()
    chosen = None
    for pair in itertools.combinations(ids, 2):
        n = stop_lengths(free.completion_tokens, pair)
        last = free.completion_tokens[np.arange(len(n)), n - 1]
        by_eos = (n <= row_budgets) & np.isin(last, pair) & (n < T)
        by_budget = stop_lengths(free.completion_tokens, pair, row_budgets) < n
        # both ids end some row first, a budget cuts another, a third runs to T
        if set(last[by_eos].tolist()) == set(pair) and by_budget.any():
            if (stop_lengths(free.completion_tokens, pair, row_budgets) == T).any():
                chosen = pair
                break
    assert chosen is not None, "no EOS pair exercises every stop reason"
    out, _ = _record(
        _engine(GREEDY, WIDE, chosen), params, jax.random.key(0), max_new_tokens=budgets
    )
    keep = stop_lengths(free.completion_tokens, chosen, row_budgets)
    assert_truncated(out, free, keep)
    assert (out.completion_mask.sum(axis=1) <= row_budgets).all()


# --- sampling does not depend on the schedule ------------------------------------------


@pytest.fixture(scope="module")
def sampled(model):
    """Temperature-1 rollouts with three EOS ids and per-prompt budgets, keyed by
    (schedule, seed), each computed once."""
    _, params = model
    cache = {}

    def run(schedule, seed=5):
        if (schedule, seed) not in cache:
            engine = _engine(SAMPLED, schedule, SAMPLED_EOS)
            cache[schedule, seed] = _record(
                engine, params, jax.random.key(seed), max_new_tokens=BUDGETS
            )
        return cache[schedule, seed]

    return run


def test_samples_do_not_depend_on_the_schedule(model, sampled):
    _, params = model
    base, log = sampled(SMALL)
    lengths = base.completion_mask.sum(axis=1)
    assert len(set(lengths.tolist())) >= 3  # rows end at different steps (EOS ids, budgets)
    assert len(log["admitted"]) >= 4
    for schedule in (WIDE, PAIR, TRIO):
        other, _ = sampled(schedule)
        np.testing.assert_array_equal(other.completion_tokens, base.completion_tokens)
        np.testing.assert_array_equal(other.completion_mask, base.completion_mask)
        for name in ("sampling_logprobs", "policy_logprobs"):
            np.testing.assert_allclose(getattr(other, name), getattr(base, name), atol=1e-5)
    # The raw (uint32) form of the same key samples the same; a different key differently;
    # samples of one prompt differ from each other.
    engine = _engine(SAMPLED, SMALL, SAMPLED_EOS)
    raw, _ = _record(engine, params, jax.random.PRNGKey(5), max_new_tokens=BUDGETS)
    np.testing.assert_array_equal(raw.completion_tokens, base.completion_tokens)
    other_key, _ = sampled(SMALL, seed=6)
    assert not np.array_equal(other_key.completion_tokens, base.completion_tokens)
    tokens = base.completion_tokens
    for i, budget in enumerate(BUDGETS):
        if budget >= 3:
            assert not np.array_equal(tokens[i * G], tokens[i * G + 1]), i


def test_budgets_and_eos_ids_end_sampled_rows(sampled):
    out, _ = sampled(SMALL)
    row_budgets = np.repeat(BUDGETS, G)
    np.testing.assert_array_equal(
        out.completion_mask.sum(axis=1),
        stop_lengths(out.completion_tokens, SAMPLED_EOS, row_budgets),
    )
    n = out.completion_mask.sum(axis=1)
    ended_by_eos = np.isin(out.completion_tokens[np.arange(len(n)), n - 1], SAMPLED_EOS)
    assert ended_by_eos.any() and (~ended_by_eos & (n == row_budgets)).any()
    assert ((n == row_budgets) | ended_by_eos).all()
    np.testing.assert_array_equal(np.where(out.completion_mask, 0, out.completion_tokens), PAD)


def test_temperature_one_logprobs_equal_teacher_forcing(model, sampled):
    graphdef, params = model
    out, _ = sampled(SMALL)
    logits = teacher_forced_logits(graphdef, params, out)
    reference = np.where(
        out.completion_mask, take(jax.nn.log_softmax(logits, axis=-1), out.completion_tokens), 0.0
    )
    np.testing.assert_allclose(out.sampling_logprobs, reference, atol=1e-5, rtol=0)
    np.testing.assert_allclose(out.policy_logprobs, reference, atol=1e-5, rtol=0)


def test_shared_prefix_gives_every_sample_the_prompts_own_logits(model, sampled):
    """Every sample's first token is scored as by a separate full pass over its prompt alone,
    also when the prompt's samples are admitted in different rounds from the stored prefix."""
    graphdef, params = model
    out, log = sampled(SMALL)
    rounds = {row: r for r, rows in enumerate(log["admitted"]) for row in rows}
    split = [i for i in range(len(LENGTHS)) if rounds[i * G] != rounds[i * G + 1]]
    assert split, "no prompt had its samples admitted in different rounds"
    tokens, mask = prompts()  # one full pass over the left-padded prompts, no cache
    logits = forward_jit(graphdef, params, tokens, positions_from_mask(mask), mask)[0]
    first = np.asarray(jax.nn.log_softmax(logits[:, -1], axis=-1))
    first = np.repeat(np.stack(first), G, axis=0)
    np.testing.assert_allclose(
        out.policy_logprobs[:, 0], take(first, out.completion_tokens[:, 0]), atol=1e-5, rtol=0
    )


# --- stop rules ---------------------------------------------------------------------------

PIECES = "abcd"  # a toy detokenizer: token t reads as PIECES[t % 4]


def stop_string_rule(stop: str):
    """A `stop_strings`-like rule: keep the fewest tokens whose text contains `stop`."""

    def rule(tokens: np.ndarray) -> int:
        text = ""
        for n, token in enumerate(tokens.tolist(), start=1):
            text += PIECES[token % len(PIECES)]
            if stop in text:
                return n
        return len(tokens)

    return rule


def test_stop_rule_cuts_after_the_stop_string(model, sampled):
    """With a stop rule the engine returns its un-stopped rows (same key) cut where the rule
    says, pad and masked after the cut, even when the cut falls inside a decode call."""
    _, params = model
    full, _ = sampled(SMALL)
    rows = [seq[m] for seq, m in zip(full.completion_tokens, full.completion_mask, strict=True)]
    lengths = np.array([len(seq) for seq in rows])
    # The two-letter stop string that cuts the most rows short, leaving others whole.
    best = None
    for stop in map("".join, itertools.product(PIECES, repeat=2)):
        keep = np.array([stop_string_rule(stop)(seq) for seq in rows])
        cut = int((keep < lengths).sum())
        if cut < len(rows) and (best is None or cut > best[0]):
            best = cut, stop, keep
    cut, stop, keep = best
    assert cut >= 3, "the stop string should cut several rows"
    engine = _engine(SAMPLED, SMALL, SAMPLED_EOS, stop=stop_string_rule(stop))
    out, log = _record(engine, params, jax.random.key(5), max_new_tokens=BUDGETS)
    assert_truncated(out, full, keep)
    for seq, m in zip(out.completion_tokens, out.completion_mask, strict=True):
        text = "".join(PIECES[t % len(PIECES)] for t in seq[m])
        assert stop not in text[:-1]  # cut right after the stop string's first occurrence
    assert len(log["cuts"]) == cut
    assert any(decoded > kept for kept, decoded in log["cuts"])  # tokens past a cut cleared


# --- MoE routes and CUTS ----------------------------------------------------------------


def test_moe_routes_equal_the_static_sampler():
    """Greedy MoE rollouts: the experts of every real token (prompt and completion) equal the
    static sampler's, and padding positions hold experts 0 .. k-1 as the Rollout documents."""
    graphdef, params = random_params(MOE, seed=1, scale=0.5)
    reference = _static(graphdef, params, GREEDY, eos_id=-1)
    schedule = EngineConfig(slots=3, decode_steps=3, span_bucket=0, prefill_rows=2)
    budgets = np.array([T, 3, T, 2, 5])  # rows end early, so completions have padding too
    engine = _engine(GREEDY, schedule, (-1,), config=MOE)
    out, log = _record(engine, params, jax.random.key(0), max_new_tokens=budgets)
    assert len(log["admitted"]) >= 3
    assert_truncated(out, reference, np.repeat(budgets, G))
    k = MOE.experts_per_token
    assert out.routes.shape == (len(LENGTHS) * G, P + T, MOE.n_layers, k)
    real = np.concatenate([out.prompt_mask, out.completion_mask], axis=1)
    assert (~real[:, :P]).any() and (~real[:, P:]).any()
    np.testing.assert_array_equal(out.routes[real], reference.routes[real])
    pad = np.broadcast_to(np.arange(k), out.routes[~real].shape)
    np.testing.assert_array_equal(out.routes[~real], pad)


def candidate_set(logits, top_k, ratio, temperature):
    """[..., V] bool: top-k ∩ {p >= p_max / ratio} of softmax(logits / T), in float64."""
    z = np.asarray(logits, np.float64) / temperature
    p = np.exp(z - z.max(-1, keepdims=True))
    keep = p >= p.max(-1, keepdims=True) / ratio
    kth = np.sort(z, axis=-1)[..., -top_k][..., None]
    return keep & (z >= kth)


def test_cuts_rows_and_logprobs():
    graphdef, params = random_params(CONFIG)
    sampling = SamplingParams(temperature=2.0, top_k=6, cuts_top_k=4)
    out, _ = _record(_engine(sampling, PAIR, (-1,)), params, jax.random.key(1))
    static = _static(graphdef, params, sampling, eos_id=-1, seed=1)
    np.testing.assert_array_equal(out.cuts_rows, static.cuts_rows)
    rows = np.asarray(out.cuts_rows)
    assert rows.any() and (~rows).any()
    logits = teacher_forced_logits(graphdef, params, out)
    keep = candidate_set(logits, 4, math.e, 2.0)
    assert take(keep, out.completion_tokens)[rows].all()
    sizes = keep.sum(-1)
    assert len(set(sizes[rows].ravel().tolist())) >= 2  # several candidate-set sizes occur
    np.testing.assert_allclose(out.sampling_logprobs[rows], -np.log(sizes[rows]), atol=1e-6)
    # Other rows: temperature 2, top-6 of the same logits; policy log-probs: log_softmax.
    z = logits / 2.0
    kth = np.sort(z, axis=-1)[..., -6][..., None]
    z = np.where(z >= kth, z, -np.inf)
    standard = take(jax.nn.log_softmax(z, axis=-1), out.completion_tokens)
    np.testing.assert_allclose(out.sampling_logprobs[~rows], standard[~rows], atol=1e-5)
    policy = take(jax.nn.log_softmax(logits, axis=-1), out.completion_tokens)
    np.testing.assert_allclose(out.policy_logprobs, policy, atol=1e-5)


# --- errors -----------------------------------------------------------------------------


# --- in-flight weight updates ----------------------------------------------------------


def test_weight_swap_between_decode_calls_stamps_each_tokens_version(model):
    """Weights A (version 3) prefill and decode the first round; the swap hands over B
    (version 4) before the second. A token records the version whose logits it was sampled
    from: tokens stamped 3 score as teacher forcing under A, the rows of prompts prefilled
    after the swap as teacher forcing under B, and rows decoding across it record both (a
    partial rollout: B continues on A's cache)."""
    graphdef, params_a = model
    _, params_b = random_params(CONFIG, seed=9, scale=0.5)
    polls = []

    def swap():
        polls.append(len(polls))
        return (4, params_b) if len(polls) == 2 else None

    engine = _engine(SAMPLED, SMALL, SAMPLED_EOS)
    out, log = _record(engine, params_a, jax.random.key(5), version=3, swap=swap)
    assert len(polls) > 2  # polled before every round, and kept B after the swap
    versions, mask = np.asarray(out.policy_versions), out.completion_mask
    first_round = log["admitted"][0]
    prefilled_by_a = {row // G for row in first_round}  # prompts prefilled before the swap
    for row in range(len(mask)):
        stamps = versions[row][mask[row]]
        assert set(stamps.tolist()) <= {3, 4} and (np.diff(stamps) >= 0).all(), row
        n_a = int((stamps == 3).sum())
        if row in first_round:  # the first call's tokens and the one sampled from its logits
            assert 1 <= n_a <= SMALL.decode_steps + 1, (row, stamps)
        elif row // G in prefilled_by_a:  # admitted later from A's prefix: its first token
            assert n_a == 1, (row, stamps)
        else:
            assert n_a == 0, (row, stamps)
    crossing = [r for r in first_round if (mask[r] & (versions[r] == 4)).any()]
    assert crossing, "no row decoded across the swap"

    def teacher_forced(params):
        logits = teacher_forced_logits(graphdef, params, out)
        return np.asarray(take(jax.nn.log_softmax(logits, axis=-1), out.completion_tokens))

    under_a, under_b = teacher_forced(params_a), teacher_forced(params_b)
    by_a = mask & (versions == 3)
    np.testing.assert_allclose(out.policy_logprobs[by_a], under_a[by_a], atol=1e-5)
    by_b = np.asarray([row // G not in prefilled_by_a for row in range(len(mask))])
    assert by_b.any()
    np.testing.assert_allclose(
        out.policy_logprobs[by_b][mask[by_b]], under_b[by_b][mask[by_b]], atol=1e-5
    )
    # The crossing rows' late tokens came from B on A's cache: not A's log-probs.
    late = np.zeros_like(mask)
    late[crossing] = True
    late &= mask & (versions == 4)
    assert not np.allclose(out.policy_logprobs[late], under_a[late], atol=1e-3)
    # Without a swap nothing is recorded.
    plain, _ = _record(engine, params_a, jax.random.key(5))
    assert plain.policy_versions is None


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("slots", 0, "EngineConfig.slots=0 must be >= 1"),
        ("decode_steps", 0, "EngineConfig.decode_steps=0 must be >= 1"),
        ("prefill_rows", 0, "EngineConfig.prefill_rows=0 must be >= 1"),
        ("admit_after", -1, "EngineConfig.admit_after=-1 must be >= 0"),
        ("span_bucket", -4, "EngineConfig.span_bucket=-4 must be >= 0"),
    ],
)
def test_bad_engine_config_raises(field, value, match):
    with pytest.raises(ValueError, match=match):
        EngineConfig(**{field: value})


def test_bad_requests_raise(model):
    _, params = model
    engine = _engine(GREEDY, SMALL, (-1,))
    tokens, mask = prompts()
    key = jax.random.key(0)
    empty = mask.copy()
    empty[2] = False
    with pytest.raises(ValueError, match=r"prompts \[2\] have no tokens"):
        engine.generate(params, tokens, empty, key)
    for budgets in ([T] * 4, [T, T, 0, T, T], [T, T, T + 1, T, T]):
        with pytest.raises(ValueError, match=rf"max_new_tokens must be 5 budgets in \[1, {T}\]"):
            engine.generate(params, tokens, mask, key, max_new_tokens=budgets)
    with pytest.raises(ValueError, match="need \\[B, P\\]"):
        engine.generate(params, tokens[0], mask[0], key)
    with pytest.raises(ValueError, match="n_samples=0 must be >= 1"):
        engine.generate(params, tokens, mask, key, n_samples=0)
    with pytest.raises(ValueError, match="max_new_tokens=0 must be >= 1"):
        Engine(abstract_model(CONFIG)[0], CONFIG, max_new_tokens=0, eos_ids=(1,), pad_id=PAD)
