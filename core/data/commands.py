"""``tunedeck data check FILE [--model M] [--max-seq-len N] [--overlong cut|drop] [--thinking true|false]
[--max-errors N] [--json]``.

Exit codes: 0 the data is fine; 1 the data has problems (or cannot be read); 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys

from core.i18n import t
from core.units import format_magnitude

EXIT_DATA_PROBLEMS = 1
EXIT_USAGE = 2


def register(subparsers: argparse._SubParsersAction) -> None:
    data = subparsers.add_parser("data", help=t("data.cli_help"), description=t("data.cli_help"))
    data_sub = data.add_subparsers(dest="data_command", metavar="SUBCOMMAND")
    data_sub.required = True
    check = data_sub.add_parser("check", help=t("data.check_help"), description=t("data.check_help"))
    check.add_argument("file", metavar="FILE", help=t("data.check_file_help"))
    check.add_argument("--model", metavar="M", default=None, help=t("data.check_model_help"))
    check.add_argument("--max-seq-len", metavar="N", type=int, default=None, help=t("data.check_max_seq_help"))
    check.add_argument("--overlong", choices=("cut", "drop"), default="cut", help=t("data.check_overlong_help"))
    check.add_argument("--thinking", choices=("true", "false"), default=None, help=t("data.check_thinking_help"))
    check.add_argument("--max-errors", metavar="N", type=int, default=50, help=t("data.check_max_errors_help"))
    check.add_argument("--json", action="store_true", help=t("data.check_json_help"))
    check.set_defaults(handler=run_check)


def run_check(args: argparse.Namespace) -> int:
    from core.data.issues import DataError
    from core.data.stats import check_data
    from core.errors import CliError

    if args.max_seq_len is not None and args.max_seq_len < 1:
        raise CliError(t("data.bad_max_seq_len", value=args.max_seq_len), EXIT_USAGE)
    if args.max_errors < 1:
        raise CliError(t("data.bad_max_errors", value=args.max_errors), EXIT_USAGE)
    tokenizer = None
    if args.model:
        from core.data.stats import load_tokenizer

        if not args.json:
            print(t("data.loading_tokenizer", model=args.model), file=sys.stderr)
        try:
            tokenizer = load_tokenizer(args.model)
        except (FileNotFoundError, ValueError) as exc:
            raise CliError(str(exc), EXIT_USAGE) from None
    try:
        # the run key thinking: the template renders the samples as the run will (unset: its default)
        thinking = None if args.thinking is None else args.thinking == "true"
        report = check_data(args.file, tokenizer, args.max_seq_len, max_issues=args.max_errors, thinking=thinking,
                            overlong=args.overlong)
    except DataError as exc:
        if args.json:
            print(json.dumps({"path": args.file, "ok": False, "format": None, "records": 0, "rows": 0,
                              "issues": [issue.to_dict() for issue in exc.issues], "more_issues": exc.more,
                              "tokens": None}, ensure_ascii=False))
            return EXIT_USAGE
        # The file itself does not read (missing, a folder, an unknown suffix): a user error, as for train.
        raise CliError(str(exc), EXIT_USAGE) from None
    if args.model and report.lengths is not None:
        report.lengths.method = t("data.method_tokenizer", name=args.model)
    if report.lengths is not None:
        report.lengths.thinking = thinking
    empty = none_left(report)  # overlong: drop would leave the run nothing: a problem, as train says
    if args.json:
        print(json.dumps({**report.to_dict(), **({"ok": False, "none_left": empty} if empty else {})},
                         ensure_ascii=False))
    else:
        print(render_report(report))
    return 0 if report.ok and not empty else EXIT_DATA_PROBLEMS


def _label(key: str) -> str:
    """A label of the report, padded to its column in cells (a Chinese label is two cells a character)."""
    from core.text_width import pad

    return pad(t(key), 10)


def none_left(report) -> str | None:
    """What a run would say before it trains nothing, when every sample counted (by the tokenizer, exactly) is
    longer than max_seq_len: with ``overlong: drop`` all are left out; with cut, when the cut leaves every one
    without its answer. None otherwise."""
    stats = report.lengths
    if (stats is None or not stats.exact or stats.max_seq_len is None
            or not stats.count or stats.over_max != stats.count):
        return None
    if stats.overlong != "drop":  # cut: none left when the cut leaves every sample without its answer
        if stats.cut_no_answer != stats.count:
            return None
        return t("train.all_cut_no_answer", datasets=report.path, count=stats.count, max_seq_len=stats.max_seq_len,
                 first=stats.cut_no_answer_first)
    return t("train.all_overlong_dropped", datasets=report.path, count=stats.over_max, max_seq_len=stats.max_seq_len)


def render_report(report) -> str:
    """The human-readable report of ``tunedeck data check``."""
    lines = [report.path]
    fmt = report.format or t("data.format_unknown")
    lines.append(f"  {_label('data.label_format')}{t('data.format_' + report.format) if report.format else fmt}")
    lines.append(f"  {_label('data.label_records')}" + t(
        "data.records_line", records=report.records, rows=report.rows, conversations=report.conversations,
        turns=report.turns, text=report.text_records))
    if report.untrained_turns:
        lines.append(" " * 12 + t("data.untrained_turns", count=report.untrained_turns))
    if report.left_out:
        lines.append(" " * 12 + t("data.left_out_splits", files=", ".join(report.left_out)))
    stats = report.lengths
    if stats is not None:
        lines.append(f"  {_label('data.label_tokens')}" + t(
            "data.tokens_line", min=stats.min, mean=stats.mean, p50=stats.p50, p95=stats.p95, max=stats.max,
            method=stats.method))
        if stats.max_seq_len is not None:
            key = "data.over_max_approx" if not stats.exact else \
                "data.over_max_exact_drop" if stats.overlong == "drop" else "data.over_max_exact"
            lines.append(" " * 12 + t(key, count=stats.over_max, total=stats.count, limit=stats.max_seq_len))
            if stats.exact and stats.overlong != "drop" and stats.cut_no_answer:
                lines.append(" " * 12 + t("data.cut_no_answer", count=stats.cut_no_answer,
                                          first=stats.cut_no_answer_first))
        if not stats.exact:
            lines.append(" " * 12 + t("data.approx_hint"))
    for where, chars, counted in report.capped:
        lines.append(" " * 12 + t("data.record_capped", where=where, size=format_magnitude(chars), tokens=counted))
    # No sample left to train on (overlong: drop) is a problem, the one the exit status says: counted and
    # listed with the others. Before, it stood above "problems none" while the check exited 1.
    empty = none_left(report)
    if report.issues or empty:
        total = len(report.issues) + report.more_issues + (1 if empty else 0)
        lines.append(f"  {_label('data.label_problems')}{total}")
        lines += [f"    {problem}" for problem in ([empty] if empty else []) + list(report.issues)]
        if report.more_issues:
            lines.append("    " + t("data.more_issues", count=report.more_issues))
    else:
        lines.append(f"  {_label('data.label_problems')}{t('data.no_problems')}")
    return "\n".join(lines)
