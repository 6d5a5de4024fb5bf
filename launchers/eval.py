"""`python -m launchers.eval --config=...`: the same program as `rljax eval` (its flags are
documented in rljax/launch/eval.py)."""

from rljax.launch.huge_pages import restart_with_huge_pages

if __name__ == "__main__":
    restart_with_huge_pages()  # before jax: glibc reads its tunables at process start
    from rljax.launch.eval import launch

    launch()
