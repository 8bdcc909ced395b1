"""The ``raylens`` command."""

from __future__ import annotations

import argparse
import sys

import raylens


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raylens", description="See where host memory goes on a Ray cluster."
    )
    parser.add_argument("--version", action="version", version=f"raylens {raylens.__version__}")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    parser.parse_args(argv)
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
