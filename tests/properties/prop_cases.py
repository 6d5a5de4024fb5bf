"""Shared hypothesis strategies and checks for the property tests in tests/properties/.

A `Case` is one random rollout batch in numpy: B = G * n_groups samples (G in 2..8, 1..4
groups, from a small fixed menu so that JAX compiles few shapes), T in {4, 16}, completion
masks with fully masked rows, single-token rows and holes, rewards drawn from extreme values
(0, +-1, +-1e6, 1e-30, all-equal groups), log-probs in [-50, 0] with old/new gaps up to 30
nats (ratios up to e^+-30), and every `extras` entry some transform reads. Hypothesis draws
the regimes (shape, reward kind, mask kind, gap size) and a seed; numpy fills the arrays, so
drawing stays cheap. The test files import this module after putting its directory on
sys.path (tests/ has no __init__.py).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from rljax.core.batch import Batch, make_batch
from rljax.core.transform import Context

# (G, number of groups, T). Every new shape costs a full XLA compile of the program under
# test (seconds on a loaded 2-core machine), so the transforms and objectives run on one
# shape and the array functions that carry the group logic on two (G = 2 and 8, 4 and 1 groups).
MAIN_SHAPE = ((4, 2, 16),)
GROUP_SHAPES = ((2, 4, 16), (8, 1, 16))
EXTREME = np.array([0.0, 1.0, -1.0, 1e6, -1e6, 1e-30, -1e-30, 0.5], np.float32)
REWARD_KINDS = ("binary", "extreme", "normal", "all_equal", "one_group_equal")
MASK_KINDS = ("full", "prefix", "holes", "empty_rows", "single_token", "all_empty")
VOCAB = 3  # a tiny vocabulary, so that responses share prefixes
CAPACITY = 6  # prompt-id slots of stateful transforms
EMBED_DIM = 3

PROPS = settings(
    max_examples=15,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
CTX = Context(step=jnp.int32(3), rng=jax.random.PRNGKey(0), extras={})


@dataclasses.dataclass
class Case:
    """One random batch, as numpy arrays, plus the new policy's log-probs and entropy."""

    group_size: int
    completion_tokens: np.ndarray  # [B, T] int32
    completion_mask: np.ndarray  # [B, T] bool
    rewards: np.ndarray  # [B] float32
    old_logprobs: np.ndarray  # [B, T]
    rollout_logprobs: np.ndarray
    ref_logprobs: np.ndarray
    new_logprobs: np.ndarray
    new_entropy: np.ndarray
    advantages: np.ndarray  # [B, T], 0 on masked tokens
    extras: dict

    @property
    def shape(self) -> tuple[int, int]:
        return self.completion_mask.shape

    @property
    def group_id(self) -> np.ndarray:
        b = self.shape[0]
        return np.repeat(np.arange(b // self.group_size), self.group_size).astype(np.int32)

    def arrays(self) -> dict:
        """Every array of the case in one flat dict (the argument of a jitted test program)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        del fields["group_size"], fields["extras"]
        return {**fields, **self.extras, "group_id": self.group_id}

    def batch(self, extras=(), rewards=None) -> Batch:
        """`build_batch` of this case's arrays."""
        return build_batch(self.arrays(), extras, rewards)

    def permuted(self, perm: np.ndarray) -> "Case":
        """The same case with its groups reordered by `perm` (a permutation of the groups)."""
        rows = (perm[:, None] * self.group_size + np.arange(self.group_size)).reshape(-1)

        def take(x):
            return x[rows] if isinstance(x, np.ndarray) and x.shape[:1] == (len(rows),) else x

        fields = {f.name: take(getattr(self, f.name)) for f in dataclasses.fields(self)}
        fields["extras"] = {k: take(v) for k, v in self.extras.items()}
        return Case(**fields)


def build_batch(a: dict, extras=(), rewards=None) -> Batch:
    """A `Batch` from `Case.arrays()` (numpy or traced), holding only the named extras: some
    transforms branch on which keys are present."""
    b = a["completion_mask"].shape[0]
    return make_batch(
        prompt_tokens=jnp.ones((b, 2), jnp.int32),
        prompt_mask=jnp.ones((b, 2), bool),
        completion_tokens=a["completion_tokens"],
        completion_mask=a["completion_mask"],
        group_id=a["group_id"],
        rewards=a["rewards"] if rewards is None else rewards,
        rollout_logprobs=a["rollout_logprobs"],
        old_logprobs=a["old_logprobs"],
        ref_logprobs=a["ref_logprobs"],
        advantages=a["advantages"],
        extras={k: a[k] for k in extras},
    )


def _masks(rng: np.random.Generator, kind: str, b: int, t: int) -> np.ndarray:
    pos = np.arange(t)[None, :]
    if kind == "full":
        return np.ones((b, t), bool)
    if kind == "all_empty":
        return np.zeros((b, t), bool)
    if kind == "holes":
        return rng.random((b, t)) < 0.5
    if kind == "single_token":
        lengths = rng.choice([0, 1, t], size=b)
        lengths[0] = 1
        return pos < lengths[:, None]
    lengths = rng.integers(0, t + 1, size=b)
    if kind == "empty_rows":
        lengths[rng.random(b) < 0.5] = 0
        lengths[0] = 0
    return pos < lengths[:, None]


def _rewards(rng: np.random.Generator, kind: str, b: int, g: int) -> np.ndarray:
    if kind.startswith("binary"):
        r = rng.integers(0, 2, size=b).astype(np.float32)
        if kind == "binary_one_group_equal":
            r[:g] = rng.integers(0, 2)
        return r
    if kind == "normal":
        return rng.normal(size=b).astype(np.float32)
    r = rng.choice(EXTREME, size=b)
    if kind == "all_equal":
        r[:] = rng.choice(EXTREME)
    elif kind == "one_group_equal":
        r[:g] = rng.choice(EXTREME)
    return r.astype(np.float32)


@st.composite
def cases(draw, shapes=MAIN_SHAPE, reward_kinds=REWARD_KINDS, mask_kinds=MASK_KINDS):
    """Strategy of `Case`s; restrict `reward_kinds` etc. where an input is out of contract."""
    g, n_groups, t = draw(st.sampled_from(shapes))
    reward_kind = draw(st.sampled_from(reward_kinds))
    mask_kind = draw(st.sampled_from(mask_kinds))
    big_gap = draw(st.booleans())
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    b = g * n_groups
    mask = _masks(rng, mask_kind, b, t)
    rewards = _rewards(rng, reward_kind, b, g)

    def logprobs():
        return rng.uniform(-50.0, 0.0, (b, t)).astype(np.float32)

    old = logprobs()
    gap_scale = 30.0 if big_gap else 0.05
    new = np.clip(old + rng.uniform(-gap_scale, gap_scale, (b, t)), -50.0, 0.0)
    rollout = np.clip(old + rng.uniform(-gap_scale, gap_scale, (b, t)), -50.0, 0.0)
    ref = np.clip(old + rng.uniform(-gap_scale, gap_scale, (b, t)), -50.0, 0.0)
    adv_values = rng.choice(EXTREME, (b, t)) if big_gap else rng.normal(size=(b, t))
    advantages = np.where(mask, adv_values, 0.0).astype(np.float32)
    p = np.exp(old)
    # Prompt embeddings shared by the samples of a prompt, some prompts identical.
    prompt_emb = rng.normal(size=(n_groups, EMBED_DIM)) * rng.choice([1e-3, 1.0, 1e3])
    prompt_emb[rng.random(n_groups) < 0.3] = 0.0
    extras = {
        "old_values": rng.normal(size=(b, t)).astype(np.float32) * 10,
        "token_rewards": np.where(rng.random((b, t)) < 0.3, rng.choice(EXTREME, (b, t)), 0.0),
        "baseline_reward": np.repeat(rng.choice(EXTREME, n_groups), g),
        "agent_id": rng.integers(0, 3, size=b).astype(np.int32),
        "prompt_id": rng.integers(-1, CAPACITY + 1, size=b).astype(np.int32),
        "correct": rng.random(b) < 0.5,
        "old_entropy": rng.uniform(0.0, np.log(32000.0), (b, t)),
        "old_ref_hellinger": rng.uniform(0.0, 1.0, (b, t)),
        "old_sum_sq_prob": p**2 + (1.0 - p**2) * rng.random((b, t)),
        "prompt_embedding": np.repeat(prompt_emb, g, axis=0),
        "sequence_advantage": rng.choice(EXTREME, b),
        "cov_noise": rng.random((b, t)),
        "binary_rewards": _rewards(rng, "binary_one_group_equal", b, g),
        "gpm_embedding": rng.normal(size=(b, 3, 2)) * rng.choice([1e-3, 1.0, 1e3]),
    }
    extras = {k: v.astype(np.float32) if v.dtype == np.float64 else v for k, v in extras.items()}
    return Case(
        group_size=g,
        completion_tokens=rng.integers(0, VOCAB, size=(b, t)).astype(np.int32),
        completion_mask=mask,
        rewards=rewards,
        old_logprobs=old,
        rollout_logprobs=rollout.astype(np.float32),
        ref_logprobs=ref.astype(np.float32),
        new_logprobs=new.astype(np.float32),
        new_entropy=rng.uniform(0.0, np.log(32000.0), (b, t)).astype(np.float32),
        advantages=advantages,
        extras=extras,
    )


def jit_program(program):
    """`run(case)`: `program(arrays, group_size)` jitted once (G static), outputs in numpy.

    One program computes every function under test on a case, so that JAX compiles once per
    shape of the menu instead of once per function and shape.
    """
    jitted = jax.jit(program, static_argnums=1)

    def run(case: Case):
        return jax.tree_util.tree_map(np.asarray, jitted(case.arrays(), case.group_size))

    return run


def assert_finite(tree, what: str = "output") -> None:
    """Every floating leaf of `tree` is finite (no NaN, no inf)."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        arr = np.asarray(leaf)
        if np.issubdtype(arr.dtype, np.floating):
            bad = ~np.isfinite(arr)
            assert not bad.any(), f"{what}{jax.tree_util.keystr(path)} has non-finite {arr[bad]}"


def assert_metrics(metrics: dict) -> None:
    """Metrics are finite float scalars (or int scalars)."""
    assert isinstance(metrics, dict)
    for key, value in metrics.items():
        arr = np.asarray(value)
        assert arr.shape == (), f"metric {key} has shape {arr.shape}, expected a scalar"
        assert np.issubdtype(arr.dtype, np.number), f"metric {key} has dtype {arr.dtype}"
        assert np.isfinite(arr), f"metric {key} = {arr} is not finite"


def assert_token_field(x, mask: np.ndarray, what: str, zero_off_mask: bool = True) -> None:
    """x is a finite float32 [B, T] array, 0 off the mask when `zero_off_mask`."""
    arr = np.asarray(x)
    assert arr.shape == mask.shape, f"{what} has shape {arr.shape}, expected {mask.shape}"
    assert arr.dtype == np.float32, f"{what} has dtype {arr.dtype}, expected float32"
    assert_finite(arr, what)
    if zero_off_mask:
        assert np.all(arr[~mask] == 0), f"{what} is nonzero on masked tokens: {arr[~mask]}"


def assert_same_structure(new_state, init_state) -> None:
    """A transform's new state has the init state's tree structure, shapes and dtypes."""
    assert jax.tree_util.tree_structure(new_state) == jax.tree_util.tree_structure(init_state)
    for a, b in zip(jax.tree_util.tree_leaves(new_state), jax.tree_util.tree_leaves(init_state)):
        assert jnp.shape(a) == jnp.shape(b) and jnp.result_type(a) == jnp.result_type(b)
    assert_finite(new_state, "state")


def group_sums(x: np.ndarray, group_size: int) -> np.ndarray:
    """[B] -> [B/G] sums over each contiguous group, in float64."""
    return np.asarray(x, np.float64).reshape(-1, group_size).sum(axis=1)
