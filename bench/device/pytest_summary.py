"""The short summary of a device test run (bench/device/pytest_call.sh): counts per part, failures by name
with their first line, skips by reason, the versions and the GPU.

    python3 bench/device/pytest_summary.py --out SUMMARY.md --junit-dir DIR [--parts parts.txt]
        [--versions versions.json] [--box box.txt] [--tree TEXT] [--limit S] [--install MODE]

Reads DIR/junit-<part>.xml (xunit1: each case names its file and line). Standard library only.
"""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def cases(path: Path) -> list[dict]:
    """(nodeid, outcome, message) of each test case in a junit file; [] when it cannot be read."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return []
    found = []
    for case in root.iter("testcase"):
        if not case.get("name"):  # the case a SIGINT interrupted: pytest writes it bare
            continue
        file, name = case.get("file") or case.get("classname", "").replace(".", "/") + ".py", case.get("name", "")
        where = f"{file}:{int(case.get('line')) + 1}" if case.get("line") else file
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                message = (child.get("message") or child.text or "").strip()
                if child.tag == "skipped" and child.get("type") == "pytest.xfail":
                    outcome = "xfailed"
                break
        found.append({"id": f"{file}::{name}", "where": where, "outcome": outcome, "message": message})
    return found


def first_line(text: str, width: int = 220) -> str:
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    return line if len(line) <= width else line[: width - 1] + "…"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--junit-dir", required=True)
    ap.add_argument("--parts")
    ap.add_argument("--versions")
    ap.add_argument("--box")
    ap.add_argument("--tree", default="")
    ap.add_argument("--limit", default="")
    ap.add_argument("--install", default="")
    ap.add_argument("--logs-dir", help="pytest-<part>.log: where a part the guard stopped was")
    args = ap.parse_args()

    ran: dict[str, tuple[int, int]] = {}  # part -> (exit status, seconds)
    if args.parts and Path(args.parts).is_file():
        for line in Path(args.parts).read_text().split("\n"):
            if line.strip():
                part, rc, secs = line.split()
                ran[part] = (int(rc), int(secs))
    junit = {p.stem.removeprefix("junit-"): p for p in sorted(Path(args.junit_dir).glob("junit-*.xml"))}
    names = list(ran) or list(junit)
    versions = {}
    if args.versions and Path(args.versions).is_file():
        try:
            versions = json.loads(Path(args.versions).read_text())
        except ValueError:
            versions = {}

    lines = ["# The test suite on the GPU machine (issue #15)", ""]
    gpu = ", ".join(versions.get("gpus") or []) or "none visible to torch"
    lines += [f"- tree: {args.tree}", f"- GPU: {gpu}; CUDA {versions.get('cuda')}; "
              f"Python {versions.get('python')} ({versions.get('executable')}); wheels installed: {args.install}"]
    if args.box and Path(args.box).is_file():
        box = Path(args.box).read_text(errors="replace").splitlines()
        lines += [f"- box: {' / '.join(b.strip() for b in box if b.startswith(('gpu:', 'cores:')))}"]
    v = versions.get("versions", {})
    if v:
        lines += ["- versions: " + ", ".join(f"{k} {val}" for k, val in v.items())]
    lines += [f"- guard: {args.limit} s for the whole call (parts side by side unless PARALLEL=0); "
              "CUDA hidden from all parts but gpu (tests/conftest.py), NVML and nvidia-smi real in all", ""]

    lines += ["| part | passed | failed | errors | skipped | seconds | exit | note |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    total: dict[str, int] = defaultdict(int)
    failures, skips = [], defaultdict(list)
    for part in names:
        found = cases(junit[part]) if part in junit else []
        count = defaultdict(int)
        for case in found:
            count[case["outcome"]] += 1
            total[case["outcome"]] += 1
            if case["outcome"] in ("failed", "error"):
                failures.append((part, case))
            elif case["outcome"] == "skipped":
                skips[first_line(case["message"])].append(case["id"])
        rc, secs = ran.get(part, (None, None))
        note = {None: "", 0: "", 1: "tests failed", 2: "interrupted", 3: "internal error", 4: "usage error",
                5: "no tests collected", 124: "stopped by the guard (SIGINT): results up to then",
                137: "killed after the guard"}.get(rc, f"exit {rc}")
        log = Path(args.logs_dir or "/nonexistent") / f"pytest-{part}.log"
        if rc == 124 and log.is_file():
            hit = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.endswith(": KeyboardInterrupt")]
            if hit:
                note += f", in {hit[-1].removesuffix(': KeyboardInterrupt')}"
        if part not in junit:
            note = (note + "; " if note else "") + "no junit file"
        lines.append(f"| {part} | {count['passed']} | {count['failed']} | {count['error']} | {count['skipped']} | "
                     f"{secs if secs is not None else ''} | {rc if rc is not None else ''} | {note} |")
    lines.append(f"| all | {total['passed']} | {total['failed']} | {total['error']} | {total['skipped']} | | | |")
    lines.append("")

    lines.append(f"## Failures and errors ({len(failures)})")
    lines.append("")
    for part, case in failures:
        lines.append(f"- [{part}] `{case['id']}` ({case['where']}): {first_line(case['message'])}")
    if not failures:
        lines.append("none")
    lines.append("")
    lines.append(f"## Skips ({sum(len(ids) for ids in skips.values())}, by reason)")
    lines.append("")
    for reason, ids in sorted(skips.items(), key=lambda item: -len(item[1])):
        shown = ", ".join(f"`{i}`" for i in ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
        lines.append(f"- {len(ids)} × {reason}: {shown}")
    if not skips:
        lines.append("none")
    Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
