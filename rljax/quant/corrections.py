"""Corrections to MX fake quantisation and QeRL's adaptive quantisation noise (AQN).

- `macro_block_quantize_mx`: a float32 scale per macro block on top of the MX block scales
  (interpretation of "Macro Block Scaling", arXiv 2603.08713, described there only as
  "higher-precision scaling at coarser granularity"; two-level scaling as in NVFP4).
- `outlier_fallback_mx`: the largest entries kept at full precision, the rest MX-quantised
  (a sparse high-precision residual; interpretation of the outlier fallback suggested with
  the MXFP4 error decomposition, arXiv 2605.20402).
- `aqn_sigma` and `add_norm_noise`: QeRL's adaptive quantisation noise (arXiv 2510.11696):
  a stepwise-decaying sigma, and Gaussian noise added to the RMSNorm weights.
- `quantize_params`: applies a fake-quantiser to every kernel of a params pytree along its
  reduction (contracted) axis.

All array functions are pure and jittable; the pytree functions work on any pytree whose
leaves are arrays, in particular the `nnx.State` params of `rljax.models.transformer`.
"""

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

from rljax.quant.fp8 import div_const
from rljax.quant.mx import MX_FORMATS, quantize_mx

# The largest element of each MX element format (E2M1: 6, E4M3: 448).
_MX_ELEM_MAX = {"mxfp4": 6.0, "mxfp8": 448.0}


def _check_fmt(fmt: str) -> float:
    if fmt not in _MX_ELEM_MAX:
        raise ValueError(f"fmt={fmt!r} is not an MX format; use one of {MX_FORMATS}")
    return _MX_ELEM_MAX[fmt]


def _check_axis(x: jax.Array, axis: int) -> int:
    if x.ndim < 1:
        raise ValueError(f"x has rank 0 (shape {x.shape}); MX quantisation needs rank >= 1")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis={axis} is out of range for x of rank {x.ndim}")
    return axis % x.ndim


@functools.partial(jax.jit, static_argnames=("fmt", "block_size", "macro_block", "axis"))
def macro_block_quantize_mx(
    x: jax.Array,
    fmt: str = "mxfp4",
    block_size: int = 32,
    macro_block: int | str = 128,
    axis: int = -1,
) -> jax.Array:
    """MX fake quantisation under an extra float32 scale per macro block (two-level scaling).

    Interpretation of "Macro Block Scaling" (arXiv 2603.08713): per macro block of
    `macro_block` consecutive entries along `axis` (or the whole line along `axis` for
    macro_block="row"), with amax_m = max |x| over the macro block,

        S_m = float32(amax_m / elem_max)     (elem_max = 6 for mxfp4, 448 for mxfp8),
        output = quantize_mx(x / S_m) * S_m  (float32 division and multiplication).

    The rescaled macro block has amax exactly (up to one float32 rounding) elem_max, so its
    MX block holding the amax gets the ideal scale 1 instead of a power of two rounded down
    from amax / elem_max; the other MX blocks of the macro block keep power-of-two scales
    relative to S_m. MX blocks nest in macro blocks (macro_block must be a multiple of
    block_size); a ragged last macro block is padded with zeros, which change nothing.

    Invariant: if every S_m is a power of two (amax_m = elem_max * 2^k), the result equals
    `quantize_mx(x, fmt, block_size, axis)` exactly (MX is equivariant under powers of two,
    barring E8M0 clamping).

    Edge cases: an all-zero macro block gives zeros; a NaN or +-inf makes its whole macro
    block NaN. XLA:CPU flushes float32 subnormals, so results are IEEE-exact only for
    macro blocks with a normal S_m (amax_m >= elem_max * 2^-126).

    Args:
      x: float array of rank >= 1.
      fmt: "mxfp4" or "mxfp8".
      block_size: entries per MX (E8M0) scale.
      macro_block: entries per float32 scale, a multiple of block_size, or "row".
      axis: the axis along which blocks run.

    Returns:
      An array with x's shape and dtype.

    Raises:
      ValueError: unknown fmt, bad block_size or macro_block, axis out of range, rank-0 x.
    """
    elem_max = _check_fmt(fmt)
    axis = _check_axis(x, axis)
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size={block_size!r} must be a positive int")
    n = x.shape[axis]
    if macro_block == "row":
        macro = max(n, 1)
    elif isinstance(macro_block, int) and macro_block >= 1 and macro_block % block_size == 0:
        macro = macro_block
    else:
        raise ValueError(
            f"macro_block={macro_block!r} must be 'row' or a positive multiple of "
            f"block_size={block_size}"
        )
    xm = jnp.moveaxis(x.astype(jnp.float32), axis, -1)
    n_macro = -(-n // macro)
    pad = n_macro * macro - n
    if pad:
        xm = jnp.pad(xm, [(0, 0)] * (xm.ndim - 1) + [(0, pad)])
    xb = xm.reshape(xm.shape[:-1] + (n_macro, macro))
    amax = jnp.max(jnp.abs(xb), axis=-1, keepdims=True)
    scale = div_const(amax, elem_max)
    zero = scale == 0
    safe = jnp.where(zero, jnp.float32(1), scale)
    q = quantize_mx(xb / safe, fmt=fmt, block_size=block_size, axis=-1)
    out = jnp.where(zero, jnp.float32(0), q * safe)
    out = out.reshape(xm.shape)[..., :n]
    return jnp.moveaxis(out, -1, axis).astype(x.dtype)


def num_outliers(fraction: float, size: int) -> int:
    """The number of entries `outlier_fallback_mx` keeps: ceil(fraction * size).

    fraction * size is first rounded to 6 decimals so that float noise does not add an entry
    (0.07 * 100 = 7.000000000000001 keeps 7, not 8).

    Raises:
      ValueError: fraction outside [0, 1).
    """
    if not (isinstance(fraction, (int, float)) and 0 <= fraction < 1):
        raise ValueError(f"fraction={fraction!r} must be a number in [0, 1)")
    return min(math.ceil(round(fraction * size, 6)), size)


@functools.partial(jax.jit, static_argnames=("fraction", "fmt", "block_size", "axis"))
def outlier_fallback_mx(
    x: jax.Array,
    fraction: float = 0.01,
    fmt: str = "mxfp4",
    block_size: int = 32,
    axis: int = -1,
) -> jax.Array:
    """MX fake quantisation with the largest entries kept at full precision.

    Interpretation of the outlier fallback x_hat = Q(x) + 1_S (x - Q(x)) (a sparse
    high-precision residual; arXiv 2605.20402 context): S = the k = ceil(fraction * N)
    entries of largest |x| over the whole tensor (N = x.size; see `num_outliers`), ties
    broken towards the lower flat (row-major) index, as `jax.lax.top_k` does. The outliers
    are zeroed before the MX block scales are computed, so they do not inflate their blocks'
    scales; the output is x on S and quantize_mx(x with S zeroed) elsewhere.

    fraction=0 is exactly `quantize_mx(x, fmt, block_size, axis)`. A NaN is ordered by
    `lax.top_k` (as the largest value); if it is not among the outliers its MX block is NaN.

    Args:
      x: float array of rank >= 1.
      fraction: share of entries kept, in [0, 1) (static).
      fmt: "mxfp4" or "mxfp8".
      block_size: entries per MX scale.
      axis: the axis along which MX blocks run.

    Returns:
      An array with x's shape and dtype.

    Raises:
      ValueError: fraction outside [0, 1), unknown fmt, bad block_size or axis.
    """
    _check_fmt(fmt)
    _check_axis(x, axis)
    k = num_outliers(fraction, x.size)
    if k == 0:
        return quantize_mx(x, fmt=fmt, block_size=block_size, axis=axis)
    flat = jnp.abs(x.astype(jnp.float32)).reshape(-1)
    _, idx = lax.top_k(flat, k)
    mask = jnp.zeros(flat.shape, bool).at[idx].set(True).reshape(x.shape)
    q = quantize_mx(
        jnp.where(mask, jnp.zeros_like(x), x), fmt=fmt, block_size=block_size, axis=axis
    )
    return jnp.where(mask, x, q)


def check_aqn_schedule(
    total_steps: int, sigma_start: float, sigma_end: float, num_stages: int
) -> None:
    """The checks of `aqn_sigma`'s schedule arguments alone (no JAX op: config validation
    calls it and must not trace or compile anything).

    Raises:
      ValueError: total_steps < 1, num_stages < 2, or non-positive sigmas.
    """
    if not isinstance(num_stages, int) or num_stages < 2:
        raise ValueError(f"num_stages={num_stages!r} must be an int >= 2")
    if not isinstance(total_steps, int) or total_steps < 1:
        raise ValueError(f"total_steps={total_steps!r} must be an int >= 1")
    if not (sigma_start > 0 and sigma_end > 0):
        raise ValueError(f"sigma_start={sigma_start} and sigma_end={sigma_end} must be > 0")


def aqn_sigma(
    step,
    total_steps: int,
    sigma_start: float = 1e-2,
    sigma_end: float = 1e-4,
    num_stages: int = 10,
) -> jax.Array:
    """QeRL's AQN noise level at a training step (arXiv 2510.11696, NVlabs/QeRL
    `trl_trainer/noise_scheduler.py`).

    Training is split into num_stages equal intervals of total_steps / num_stages steps;
    step lies in interval i = floor(step * num_stages / total_steps) (integer arithmetic,
    clamped to [0, num_stages - 1], so steps past total_steps stay in the last interval).
    Interval 0 has sigma = 0; interval i >= 1 has

        sigma = sigma_start * (sigma_end / sigma_start) ** ((i - 1) / (num_stages - 2)),

    a geometric decay from sigma_start (i = 1) to sigma_end (i = num_stages - 1); with
    num_stages = 2 the only noisy interval has sigma_start.

    Jittable with a traced integer `step` (the other arguments are Python numbers); the
    product step * num_stages must fit in int32.

    Args:
      step: the current step (int or int array scalar, >= 0).
      total_steps: the number of training steps, >= 1.
      sigma_start: sigma of the first noisy interval, > 0.
      sigma_end: sigma of the last interval, > 0.
      num_stages: the number of intervals, >= 2 (QeRL's default 10).

    Returns:
      A float32 scalar.

    Raises:
      ValueError: total_steps < 1, num_stages < 2, or non-positive sigmas.
    """
    check_aqn_schedule(total_steps, sigma_start, sigma_end, num_stages)
    step = jnp.asarray(step, jnp.int32)
    i = jnp.clip((step * num_stages) // total_steps, 0, num_stages - 1)
    t = (i - 1).astype(jnp.float32) / max(num_stages - 2, 1)
    ratio = jnp.float32(sigma_end / sigma_start)
    sigma = jnp.float32(sigma_start) * ratio**t
    return jnp.where(i == 0, jnp.float32(0), sigma)


def path_names(path) -> tuple[str, ...]:
    """The names along a pytree key path as strings, without nnx's trailing "value".

    E.g. ('layers', '0', 'attn_norm', 'weight') for an `nnx.State` leaf
    `['layers'][0]['attn_norm']['weight'].value`.
    """
    names = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                names.append(str(getattr(key, attr)))
                break
        else:
            names.append(str(key))
    if names and names[-1] == "value":
        names.pop()
    return tuple(names)


def is_norm_weight(names: tuple[str, ...]) -> bool:
    """The default RMSNorm-weight rule: the leaf is named "weight" (or "scale") and its
    module's name ends in "norm".

    Matches rljax's `attn_norm`, `mlp_norm`, `final_norm` (and HF-style `input_layernorm`,
    `post_attention_layernorm`, `norm`, `q_norm`, `k_norm`).
    """
    return len(names) >= 2 and names[-1] in ("weight", "scale") and names[-2].endswith("norm")


def add_norm_noise(
    params,
    rng: jax.Array,
    sigma,
    is_norm: Callable[[tuple[str, ...]], bool] = is_norm_weight,
):
    """QeRL AQN (arXiv 2510.11696): w <- w + N(0, sigma^2) on every RMSNorm weight.

    In QeRL the noise is added to the rollout model's RMSNorm weights after every weight
    sync, freshly drawn each time; the trainer's weights get none. Leaves are selected by
    `is_norm(path_names(path))` (default `is_norm_weight`); every other leaf is returned
    unchanged (the same array). Each selected leaf gets independent noise from
    `jax.random.fold_in(rng, leaf_index)`, drawn and added in float32, then cast back to the
    leaf's dtype. sigma = 0 returns the selected leaves bit-identical too. Jittable
    (sigma may be traced).

    Args:
      params: a pytree of arrays, e.g. an `nnx.State` from `create_model`.
      rng: a JAX PRNG key.
      sigma: noise standard deviation (float or float32 scalar, e.g. from `aqn_sigma`).
      is_norm: predicate on a leaf's path names selecting the norm weights.

    Returns:
      A pytree with params' structure.
    """
    sigma = jnp.asarray(sigma, jnp.float32)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
    out = []
    for i, (path, leaf) in enumerate(leaves):
        if not is_norm(path_names(path)):
            out.append(leaf)
            continue
        noise = jax.random.normal(jax.random.fold_in(rng, i), leaf.shape, jnp.float32)
        noisy = (leaf.astype(jnp.float32) + sigma * noise).astype(leaf.dtype)
        out.append(jnp.where(sigma == 0, leaf, noisy))
    return jax.tree_util.tree_unflatten(treedef, out)


# Kernels of rljax.models.transformer: (how many of one kernel's leading axes are contracted
# with the input, the rank of one kernel). x @ W, W [in, out]: reduction axis 0; o_proj
# [heads, head_dim, d_model] contracts its first two axes. Axes before one kernel's index
# separate kernels: the stacked layers (and a MoE layer's experts).
_KERNELS = {
    "q_proj": (1, 3),
    "k_proj": (1, 3),
    "v_proj": (1, 3),
    "o_proj": (2, 3),
    "gate_proj": (1, 2),
    "up_proj": (1, 2),
    "down_proj": (1, 2),
    "lm_head": (1, 2),
}


def transformer_reduction_axes(names: tuple[str, ...], leaf) -> int | None:
    """The default kernel rule of `quantize_params` for `rljax.models.transformer` params.

    Returns the number of leading axes of one kernel contracted with the input: 1 for
    q/k/v_proj [d_model, heads, head_dim], gate/up_proj [d_model, d_ff], down_proj
    [d_ff, d_model] and lm_head [d_model, vocab]; 2 for o_proj [heads, head_dim, d_model];
    None (not quantised) for everything else: norm weights, biases (q_bias is 2-D but not a
    kernel) and the embedding (a lookup table; with tie_embeddings it is also the output
    head, contracted along its axis 1; pass your own rule to quantise it).
    """
    del leaf
    kernel = _KERNELS.get(names[-1]) if names else None
    return None if kernel is None else kernel[0]


def transformer_batch_axes(names: tuple[str, ...], leaf) -> int:
    """The default batch rule of `quantize_params`: how many leading axes of a kernel leaf
    index separate kernels (the stacked layers' axis, a MoE layer's experts); 0 otherwise."""
    kernel = _KERNELS.get(names[-1]) if names else None
    return 0 if kernel is None else max(leaf.ndim - kernel[1], 0)


def kernel_batch(leaf: jax.Array, batch: int, r: int) -> jax.Array:
    """A leaf whose first `batch` axes index kernels, each contracting its next r axes, as
    [kernels, prod(contracted axes), *output axes] (row-major, as in the matmul)."""
    lead, kernel = leaf.shape[:batch], leaf.shape[batch:]
    return leaf.reshape((math.prod(lead), math.prod(kernel[:r])) + kernel[r:])


def quantize_params(
    params,
    fn: Callable[..., jax.Array],
    reduction_axes: Callable[[tuple[str, ...], jax.Array], int | None] = (
        transformer_reduction_axes
    ),
    batch_axes: Callable[[tuple[str, ...], jax.Array], int] = transformer_batch_axes,
):
    """Applies a fake-quantiser to every kernel of a params pytree along its reduction axis.

    For a leaf with r = reduction_axes(path_names(path), leaf) not None, each of its kernels
    (the leaf past its b = batch_axes(...) leading axes, e.g. one layer of the stacked
    blocks) is reshaped to [prod(shape[:r]), *shape[r:]] (the contracted axes flattened in
    row-major order, as in the matmul), passed as fn(w, axis=0), and reshaped back; every other leaf
    is returned unchanged (the same array). So MX blocks run along the input dimension of
    y = x @ W, as MX matmuls need. Jittable when fn is.

    Args:
      params: a pytree of arrays, e.g. an `nnx.State` from `create_model`.
      fn: a fake-quantiser taking (array, axis=...), e.g.
        functools.partial(quantize_mx, fmt="mxfp4") or quantize_fp8.
      reduction_axes: (path names, leaf) -> number of leading contracted axes of one kernel,
        or None to leave the leaf alone; default `transformer_reduction_axes`.
      batch_axes: (path names, leaf) -> number of leading axes that index kernels; default
        `transformer_batch_axes`.

    Returns:
      A pytree with params' structure.

    Raises:
      ValueError: a rule returning r < 1 or r >= the leaf's rank.
    """
    leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
    out = []
    for path, leaf in leaves:
        names = path_names(path)
        r = reduction_axes(names, leaf)
        if r is None:
            out.append(leaf)
            continue
        b = batch_axes(names, leaf)
        if not (isinstance(r, int) and 1 <= r < leaf.ndim - b):
            raise ValueError(
                f"reduction_axes gave {r!r} for {'/'.join(names)} of shape {leaf.shape} "
                f"with {b} batch axes; need 1 <= r < ndim - batch axes"
            )
        w = kernel_batch(leaf, b, r)
        out.append(jax.lax.map(lambda k: fn(k, axis=0), w).reshape(leaf.shape))
    return jax.tree_util.tree_unflatten(treedef, out)
