"""Shared by the tests that start the training launcher in a subprocess: where to run it, the
tiny model's flags and its environment."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A one-layer model of width 32: compiles in seconds.
TINY_MODEL = (
    "--config.model.d_model=32",
    "--config.model.n_layers=1",
    "--config.model.n_heads=2",
    "--config.model.n_kv_heads=1",
    "--config.model.d_ff=64",
)
CACHE = "JAX_COMPILATION_CACHE_DIR"


def launcher_env(compile_cache: bool = True) -> dict[str, str]:
    """This process's environment for a launcher on one CPU device (no XLA_FLAGS). Without
    `compile_cache` also without the persistent compilation cache, for tests that read every
    line of the output: other test processes evict its entries, and JAX then warns about a
    failed cache write that has nothing to do with the test (pass
    `--config.train.compilation_cache=` too)."""
    hidden = ("XLA_FLAGS",) if compile_cache else ("XLA_FLAGS", CACHE)
    return {k: v for k, v in os.environ.items() if k not in hidden}


def tiny_driver_run(config, run_dir, steps: int = 2):
    """`config` as the in-process driver tests run it: a width-16 one-layer model, no SFT,
    `steps` steps of 8 prompts x 2 samples, evaluated and checkpointed at the last step."""
    config.model.update(d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32)
    config.sft.steps = 0
    config.task.eval_size = 8
    config.rollout.n_samples = 2
    config.train.update(steps=steps, prompts_per_step=8, eval_every=steps, checkpoint_every=steps)
    config.run_dir = str(run_dir)
    return config
