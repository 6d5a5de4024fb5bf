"""`python -m launchers.train --config=...`: the same program as `rljax train` (its flags are
documented in rljax/launch/train.py)."""

from rljax.launch.huge_pages import restart_with_huge_pages

if __name__ == "__main__":
    restart_with_huge_pages()  # before jax: glibc reads its tunables at process start
    from rljax.launch.train import launch

    launch()
