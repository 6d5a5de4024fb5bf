"""Stop strings: the bisection finds the shortest prefix holding a stop string (vs brute force),
and a trainer run with `rollout.stop_strings` ends every completion at one."""

import numpy as np
import pytest

from rljax.models.tokenizer import ByteTokenizer
from rljax.rollout.stop import stop_strings


def brute_force(tokenizer, strings, tokens) -> int:
    for n in range(1, len(tokens) + 1):
        text = tokenizer.decode(tokens[:n].tolist())
        if any(s in text for s in strings):
            return n
    return len(tokens)


def test_the_rule_cuts_after_the_token_completing_the_first_stop_string():
    tokenizer = ByteTokenizer()
    rule = stop_strings(tokenizer, ["\n\n", "END"])
    rng = np.random.default_rng(0)
    alphabet = np.array(tokenizer.encode("abEND\n x"))
    for _ in range(200):
        tokens = rng.choice(alphabet, size=rng.integers(1, 30))
        assert rule(tokens) == brute_force(tokenizer, ["\n\n", "END"], tokens)
    assert rule(np.array(tokenizer.encode("ab END cd"))) == 6  # "ab END" kept whole
    assert rule(np.array(tokenizer.encode("abc"))) == 3  # no stop string: nothing cut


def test_empty_stop_strings_are_refused():
    with pytest.raises(ValueError, match="none empty"):
        stop_strings(ByteTokenizer(), [""])


def test_engine_completions_end_at_the_first_stop_string():
    import jax

    from rljax.models.config import TransformerConfig
    from rljax.models.transformer import create_model
    from rljax.rollout.engine import engine_generate

    tokenizer = ByteTokenizer()
    config = TransformerConfig(
        vocab_size=tokenizer.vocab_size, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64
    )
    graphdef, params = create_model(config, seed=0)
    tokens = np.array([tokenizer.encode("12+34=")] * 2, np.int32)
    mask = np.ones_like(tokens, bool)
    common = dict(max_new_tokens=24, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id, n_samples=4)
    free = engine_generate(graphdef, params, tokens, mask, jax.random.PRNGKey(0), **common)
    # Stop at the most common ASCII byte of the free run, so some rows are cut.
    bytes_seen = np.asarray(free.completion_tokens)[np.asarray(free.completion_mask)]
    stop = tokenizer.decode([int(np.bincount(bytes_seen[bytes_seen < 128]).argmax())])
    cut = engine_generate(
        graphdef, params, tokens, mask, jax.random.PRNGKey(0),
        stop=stop_strings(tokenizer, [stop]), **common,
    )  # fmt: skip
    rows_cut = 0
    for row in range(cut.completion_tokens.shape[0]):
        full = np.asarray(free.completion_tokens[row])[np.asarray(free.completion_mask[row])]
        kept = np.asarray(cut.completion_tokens[row])[np.asarray(cut.completion_mask[row])]
        n = brute_force(tokenizer, [stop], full)
        np.testing.assert_array_equal(kept, full[:n])  # the same sample, cut at the stop
        assert (np.asarray(cut.completion_tokens[row])[n:] == tokenizer.pad_id).all()
        rows_cut += n < full.size
    assert rows_cut > 0


def test_stop_strings_need_the_engine():
    from rljax.config import default_config
    from rljax.train.builders import build_engine_settings

    config = default_config()
    config.rollout.stop_strings = ("\n",)
    assert build_engine_settings(config, ByteTokenizer())["stop"] is not None
    config.rollout.engine = "static"
    with pytest.raises(ValueError, match="rollout.engine='continuous'"):
        build_engine_settings(config, ByteTokenizer())
