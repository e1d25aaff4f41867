"""``tunedeck import FILE [-o OUT.yaml] [--json]``: a peer's configuration → a tunedeck run YAML.

stdout gets the YAML (or, with ``--json``, ``{config, mapping}``); stderr gets the key-by-key mapping.
``tunedeck import -- swift sft --model ...`` converts a command line given as arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    from core.i18n import t

    # One file, or a swift command line after "--"; argparse's own usage (FILE [FILE ...]) promised several
    p = subparsers.add_parser("import", help=t("import.help"), description=t("import.help"),
                              usage="%(prog)s [-h] [-o OUT.yaml] [--json] (FILE | -- swift sft ARG ...)")
    p.add_argument("source", nargs="+", metavar="FILE", help=t("import.source_help"))
    p.add_argument("-o", "--output", default=None, metavar="OUT.yaml", help=t("import.output_help"))
    p.add_argument("--json", action="store_true", help=t("import.json_help"))
    p.set_defaults(handler=cmd_import)


def cmd_import(args: argparse.Namespace) -> int:
    from core.config.importers import import_command, import_file
    from core.errors import CliError
    from core.i18n import t

    if args.output and not args.json and Path(args.output).exists():  # before the mapping it would bury
        raise CliError(t("import.output_exists", path=args.output), 2)
    source = list(args.source)  # a file that cannot be imported (PeerFileError): exit 2, in core.cli
    if len(source) > 1 and not any(token.startswith("-") or "=" in token or Path(token).name == "swift"
                                   for token in source):  # `import a.yaml b.yaml`: no command, several files
        raise CliError(t("import.one_file", count=len(source), files=" ".join(source), first=source[0]), 2)
    if len(source) > 1 or Path(source[0]).name == "swift" or "=" in source[0]:
        for token in source:  # `import -- swift sft ... -o x.yaml`: argparse gave import's -o to swift
            if token in ("-o", "--output", "--json") or token.startswith("--output="):
                raise CliError(t("import.option_in_command", option=token.split("=")[0]), 2)
        result = import_command(source)
    else:
        result = import_file(source[0])
    print(result.mapping_text(), file=sys.stderr)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, ensure_ascii=False))
    elif args.output:
        from core.atomic_file import shared_file_mode, write_atomic

        out = Path(args.output)
        if out.exists():
            raise CliError(t("import.output_exists", path=str(out)), 2)
        out.parent.mkdir(parents=True, exist_ok=True)  # as `plan --save` does
        write_atomic(out, result.to_yaml(), shared_file_mode(out))  # a run YAML is no secret: the umask's mode
        print(t("import.written", path=str(out)), file=sys.stderr)
    else:
        sys.stdout.write(result.to_yaml())
    return 0
