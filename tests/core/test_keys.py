"""Declared batch keys: chain unions, the build-time check and what follows from the reads."""

import jax.numpy as jnp
import pytest

from rljax.advantages.gprl import preference_advantages
from rljax.advantages.group import group_advantages
from rljax.advantages.remax import greedy_baseline_advantages
from rljax.algorithms import Algorithm, grpo, ppo
from rljax.core import keys
from rljax.core.keys import algorithm_reads, check_algorithm, extra
from rljax.core.objective import sum_objectives
from rljax.core.transform import Transform, chain, stateless
from rljax.objectives.cispo import cispo
from rljax.objectives.gspo import gspo
from rljax.objectives.kl import kl_loss
from rljax.objectives.surrogate import ppo_clip
from rljax.quant.mismatch import truncated_is


def passthrough(reads=(), writes=(), optional_reads=()):
    """A declared transform that changes nothing."""
    return stateless(lambda batch, ctx: (batch, {}), reads, writes, optional_reads)


def test_chain_unions_in_order_and_an_earlier_write_satisfies_a_later_read():
    first = passthrough(reads={"rewards"}, writes={extra("a")})
    second = passthrough(reads={extra("a"), "group_id"}, writes={"advantages"})
    t = chain(first, second)
    assert t.reads == {"rewards", "group_id"}
    assert t.writes == {extra("a"), "advantages"}
    # Reversed, the read of extras.a is no longer satisfied inside the chain.
    assert extra("a") in chain(second, first).reads


def test_undeclared_transforms_are_skipped_without_error():
    undeclared = Transform(lambda: (), lambda batch, state, ctx: (batch, state, {}))
    assert undeclared.reads is None and undeclared.writes is None
    assert chain(undeclared, group_advantages(4)).reads is None
    algorithm = Algorithm(chain(undeclared, passthrough(reads={extra("nobody")})), ppo_clip())
    check_algorithm(algorithm)  # nobody's read may be the undeclared member's write
    check_algorithm(Algorithm(undeclared, lambda lp, ent, batch: (0.0, {})))


def test_a_read_that_nothing_produces_raises_naming_reader_and_key():
    reader = passthrough(reads={extra("nobody_writes_this")}, writes={"advantages"})
    with pytest.raises(ValueError, match=r"passthrough reads 'extras.nobody_writes_this'"):
        check_algorithm(Algorithm(chain(group_advantages(4), reader), ppo_clip()))


def test_a_transform_written_key_read_before_it_is_written_raises():
    late = passthrough(writes={keys.COV_NOISE})
    from rljax.entropy.covariance import clip_cov

    check_algorithm(Algorithm(chain(group_advantages(4), late), clip_cov()))
    with pytest.raises(ValueError, match="clip_cov reads 'extras.cov_noise'"):
        check_algorithm(Algorithm(chain(group_advantages(4)), clip_cov()))


def test_the_critic_values_need_a_value_loss():
    algorithm = ppo()
    check_algorithm(algorithm)
    with pytest.raises(ValueError, match="only the critic produces"):
        check_algorithm(algorithm._replace(value_loss=None))


@pytest.mark.parametrize("objective", [cispo(), gspo()], ids=["cispo", "gspo"])
def test_gprl_clip_scale_under_a_surrogate_that_ignores_it_raises(objective):
    advantages = preference_advantages(4, num_dimensions=2)
    with pytest.raises(ValueError) as err:
        check_algorithm(Algorithm(chain(advantages), objective))
    message = str(err.value)
    assert "preference_advantages writes 'extras.clip_scale'" in message
    assert ("cispo" if "cispo" in message else "gspo") in message
    assert "ppo_clip" in message  # who could read it
    assert "\n" not in message
    check_algorithm(Algorithm(chain(advantages), ppo_clip()))  # PPO-clip reads it


def test_optional_reads_count_as_readers_of_a_write():
    # TIS's is_weight is applied by every policy-gradient objective.
    check_algorithm(Algorithm(chain(group_advantages(4), truncated_is()), cispo()))


def test_reference_statistics_and_greedy_baseline_follow_from_the_reads():
    base = grpo(group_size=4)
    assert not base.needs_reference and base.batch_stats == () and not base.greedy_baseline
    with_kl = base._replace(objective=sum_objectives(base.objective, kl_loss(0.1)))
    assert keys.REF_LOGPROBS in algorithm_reads(with_kl) and with_kl.needs_reference
    remax = Algorithm(chain(greedy_baseline_advantages()), ppo_clip())
    assert remax.greedy_baseline
    reads_stat = chain(base.transform, passthrough(reads={keys.OLD_SUM_SQ_PROB}))
    assert base._replace(transform=reads_stat).batch_stats == ("old_sum_sq_prob",)
    # A read satisfied by an earlier transform's write makes the steps compute nothing.
    writes_first = chain(passthrough(writes={keys.BASELINE_REWARD}), greedy_baseline_advantages())
    assert not Algorithm(writes_first, ppo_clip()).greedy_baseline


def test_register_key_refuses_unknown_producers_and_silent_redeclaration():
    with pytest.raises(ValueError, match="producer"):
        keys.register_key(extra("k_test"), "[B]", "doc", "oracle")
    with pytest.raises(ValueError, match="already declared"):
        keys.register_key(keys.CLIP_SCALE, "[B]", "doc", keys.TRANSFORM)


def test_every_declared_builtin_transform_writes_what_it_declares():
    # group_advantages declares it writes advantages: applying it changes only that field.
    from rljax.core.batch import make_batch
    from rljax.core.transform import Context

    batch = make_batch(
        jnp.ones((4, 2)),
        jnp.ones((4, 2)),
        jnp.ones((4, 3)),
        jnp.ones((4, 3)),
        jnp.zeros(4),
        jnp.asarray([1.0, 0.0, 0.0, 1.0]),
    )
    t = group_advantages(4)
    out, _, _ = t.apply(batch, t.init(), Context(step=jnp.int32(0), rng=jnp.zeros(2, jnp.uint32)))
    changed = {
        f
        for f in ("rewards", "advantages", "loss_weights", "old_logprobs")
        if not jnp.array_equal(getattr(out, f), getattr(batch, f))
    }
    assert changed <= t.writes
