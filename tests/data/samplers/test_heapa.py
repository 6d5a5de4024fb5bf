"""HeaPA: heap invariants, boundary sampling, eviction, cold-first, rebalance, exact resume."""

import numpy as np

from rljax.data.samplers.heapa import HeaPAPool, HeaPASettings


def _rewards(side):
    return [e[0] for e in side.entries()]


def _check_invariants(pool):
    low, high = _rewards(pool.low), _rewards(pool.high)
    if low and high:
        assert max(low) <= min(high)
    n = len(low) + len(high)
    assert abs(len(low) - round(0.5 * n)) <= 1
    # The heap tops are the extremes of their sides.
    if low:
        assert pool.low.peek_max()[0] == max(low) and pool.low.peek_min()[0] == min(low)
    if high:
        assert pool.high.peek_min()[0] == min(high) and pool.high.peek_max()[0] == max(high)


def test_inserts_keep_heap_split_at_median():
    rng = np.random.default_rng(0)
    pool = HeaPAPool(HeaPASettings(capacity=1000), seed=0)
    for _ in range(10):
        pool.add(rng.integers(0, 10**6, size=17), rng.uniform(-1.5, 1.5, size=17))
        _check_invariants(pool)
    rewards = sorted(_rewards(pool.low) + _rewards(pool.high))
    assert min(rewards) >= -1.0 and max(rewards) <= 1.0  # clipped to [-1, 1]
    median = np.median(rewards)
    assert max(_rewards(pool.low)) <= median <= min(_rewards(pool.high))


def test_select_takes_k_of_the_2k_nearest_the_boundary():
    rng = np.random.default_rng(1)
    rewards = rng.permutation(np.linspace(-1, 1, 40))
    ids = np.arange(40)
    k = 5
    # Reference by sorting: the k largest of the lower half and the k smallest of the upper.
    order = ids[np.argsort(rewards)]
    expected = set(order[20 - k : 20 + k].tolist())
    seen = set()
    for seed in range(30):
        pool = HeaPAPool(HeaPASettings(capacity=100), seed=seed)
        pool.add(ids, rewards)
        got = pool.select(step=0, k=k)
        assert len(got) == k and len(set(got.tolist())) == k
        assert set(got.tolist()) <= expected
        rest = {e[2] for e in pool.low.entries() + pool.high.entries()}
        assert rest == set(ids.tolist()) - set(got.tolist())  # the other candidates went back
        _check_invariants(pool)
        seen |= set(got.tolist())
    assert seen == expected  # every boundary candidate can be chosen


def test_select_all_when_k_covers_pool():
    pool = HeaPAPool(HeaPASettings(capacity=10), seed=0)
    pool.add([1, 2, 3], [0.1, 0.2, 0.3])
    assert sorted(pool.select(0, 5).tolist()) == [1, 2, 3]
    assert len(pool) == 0


def test_eviction_removes_global_minimum():
    rng = np.random.default_rng(2)
    rewards = rng.uniform(-1, 1, size=20)
    pool = HeaPAPool(HeaPASettings(capacity=20), seed=0)
    assert len(pool.add(np.arange(20), rewards)) == 0
    evicted = pool.add([100], [0.9])
    assert evicted.tolist() == [int(np.argmin(rewards))]
    assert len(pool) == 20
    _check_invariants(pool)
    # A newcomer below everything is itself the global minimum and is evicted.
    assert pool.add([101], [-1.0 - 1e-9]).tolist() == [101]


def test_cold_first_fifo_and_cold_eviction_of_easiest():
    pool = HeaPAPool(HeaPASettings(capacity=6), seed=0)
    pool.add([10, 11, 12, 13], [0.1, 0.9, -0.5, 0.4])
    # Rebalancing tolerates one item off target (2 of 4): low holds only 12.
    assert [e[2] for e in pool.low.entries()] == [12]
    assert [e[2] for e in pool.high.entries()] == [10, 11, 13]
    pool.add([20, 21])  # cold, the pool is now full
    assert pool.add([22]).tolist() == [11]  # a cold arrival evicts the high maximum
    got = pool.select(step=0, k=4)
    assert got[:3].tolist() == [20, 21, 22]
    assert got[3] in (10, 12)  # one boundary pick of the high minimum and the low maximum


def test_resume_is_exact():
    def run(pool, steps):
        out = []
        for step in steps:
            ids = pool.select(step, 4)
            out.append(ids)
            pool.add(ids, np.sin(ids * 1.7 + step))
            pool.add([1000 + step])  # a new cold query
        return out

    settings = HeaPASettings(capacity=25)
    straight = HeaPAPool(settings, seed=9)
    straight.add(np.arange(30), np.cos(np.arange(30)))
    run(straight, range(5))
    saved = straight.state()
    a = run(straight, range(5, 12))
    resumed = HeaPAPool(settings, seed=9)
    resumed.load(saved)
    b = run(resumed, range(5, 12))
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert HeaPAPool(settings, 0).state() == {"low": {}, "high": {}, "cold": {}, "next_seq": 0}
