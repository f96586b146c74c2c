"""``kvpressure schema NAME [FILE ...]``: print the JSON Schema of an experiment or a record, or
check files against it."""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kvpressure.schema_files import NAMES

    parser.add_argument("name", choices=NAMES, help="which schema")
    parser.add_argument("files", nargs="*", metavar="FILE",
                        help="files to check against it (none: print the schema)")


def run(args: argparse.Namespace) -> int:
    from kvpressure.schema_files import schema_text, shipped, validate_files

    if not args.files:
        sys.stdout.write(schema_text(shipped(args.name)))
        return 0
    validate_files(args.name, args.files)
    for f in args.files:
        print(f"{f}: valid {args.name}")
    return 0
