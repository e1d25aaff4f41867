"""Finding what to watch in a directory, figures of the header, last-seen bookkeeping, the watch CLI."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from core.watch.figures import (
    cost_so_far,
    directory_size,
    format_duration,
    mfu,
    model_parameters,
    steady_tokens_per_s,
)
from core.watch.last_seen import runs_ended_since
from core.watch.source import LLAMAFACTORY, SWIFT, TUNEDECK, SourceNotFound, open_watch_source
from tests.fixtures.watch.run_builder import build_run, header_record

ROOT = Path(__file__).parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "watch"


def test_tunedeck_run_dir(tmp_path):
    path = build_run(tmp_path, "20261129-2100-a", status="finished", steps=10, total=10)
    source = open_watch_source(path)
    assert source.kind == TUNEDECK and not source.read_only
    assert source.metrics_path == path / "metrics.jsonl" and source.events_path == path / "events.jsonl"


def test_swift_output_dir_picks_the_newest_version(tmp_path):
    out = tmp_path / "output"
    shutil.copytree(FIXTURES / "swift_output", out)
    older = out / "v0-20261129-210000"
    newer = out / "v1-20261129-220000"
    shutil.copytree(older, newer)
    (newer / "logging.jsonl").touch()
    import os

    os.utime(older / "logging.jsonl", (1, 1))
    source = open_watch_source(out)
    assert source.kind == SWIFT and source.path == newer and source.read_only
    assert source.facts == {"model": "Qwen/Qwen2.5-0.5B-Instruct", "method": "lora", "precision": "bfloat16"}
    assert open_watch_source(older).path == older


def test_swift_default_output_dir_nests_each_run_under_the_model(tmp_path):
    """ms-swift's default --output_dir is output/<model>/ (3.x, 4.x; 2.x output/<model_type>/), with the run
    in vN-…/ below it: `watch output` said "not an ms-swift output directory"; it opens the newest run."""
    import os

    out = tmp_path / "output"
    older = out / "Qwen2.5-0.5B-Instruct" / "v0-20261129-210000"
    newer = out / "Qwen2.5-7B-Instruct" / "v0-20261129-220000"
    shutil.copytree(FIXTURES / "swift_output" / "v0-20261129-210000", older)
    shutil.copytree(older, newer)
    os.utime(older / "logging.jsonl", (1, 1))
    source = open_watch_source(out)
    assert source.kind == SWIFT and source.path == newer
    assert open_watch_source(out / "Qwen2.5-0.5B-Instruct").path == older


def test_a_nested_run_removed_while_the_folder_is_searched_is_passed_over(tmp_path, monkeypatch):
    """ms-swift's rotation or an rm -r can take a run folder away between the search's listing and its reading
    of the files' times: the search ended in FileNotFoundError; the run gone is no candidate. The race is
    made, not timed: the listing's own check of the older run's file deletes that folder."""
    out = tmp_path / "output"
    older = out / "Qwen2.5-0.5B-Instruct" / "v0-20261129-210000"
    newer = out / "Qwen2.5-0.5B-Instruct" / "v1-20261129-220000"
    shutil.copytree(FIXTURES / "swift_output" / "v0-20261129-210000", older)
    shutil.copytree(older, newer)
    is_file = Path.is_file

    def is_file_then_removed(self):
        found = is_file(self)
        if self.parent == older:
            shutil.rmtree(older)
        return found

    monkeypatch.setattr(Path, "is_file", is_file_then_removed)
    assert open_watch_source(out).path == newer


def test_a_run_started_beside_a_busier_one_is_found_before_it_writes_last(tmp_path):
    """Only the run folder written last was looked at: a run started while another one (there already, logging
    every second) was written to was offered only once its own last write came after that one's, and never
    while the busy one kept writing. Every run folder is looked at now; of two new ones, the one written last."""
    import os

    from core.watch.source import newer_run

    out = tmp_path / "output"
    shown = out / "v0-20261129-210000"
    shutil.copytree(FIXTURES / "swift_output" / "v0-20261129-210000", shown)
    busy = out / "v1-20261129-220000"
    shutil.copytree(shown, busy)
    os.utime(shown / "logging.jsonl", (2000, 2000))
    os.utime(busy / "logging.jsonl", (1000, 1000))
    source = open_watch_source(out)
    assert source.path == shown and newer_run(source) is None
    os.utime(busy / "logging.jsonl", (5000, 5000))  # the run beside it writes on, the newest write below out/
    started = out / "qwen" / "v2-20261130-090000"  # one started since, in ms-swift's <model>/ layout
    shutil.copytree(shown, started)
    os.utime(started / "logging.jsonl", (3000, 3000))
    newer = newer_run(source)
    assert newer is not None and newer.path == started and newer.root == out
    assert newer.runs_seen == {shown, busy, started} and newer_run(newer) is None
    second = out / "v3-20261130-100000"
    shutil.copytree(shown, second)
    os.utime(second / "logging.jsonl", (4000, 4000))
    assert newer_run(source).path == second  # two new ones: the one written last


def test_a_run_started_in_the_folder_named_is_a_newer_run_and_one_beside_it_is_not(tmp_path, monkeypatch):
    """`watch output/` opens its newest run; a run ms-swift starts there later (its next vN-…/) is what
    `watch output/ --json` then gives, and what the dashboard is told of (newer_run), not one that was there
    already when it opened, written to since (two runs side by side would take turns). The app is opened on
    the folder named, not on the run in it: it follows the newer run."""
    import os

    from core.cli import OpenApp, dispatch
    from core.watch.source import newer_run

    out = tmp_path / "output"
    first = out / "v0-20261129-210000"
    shutil.copytree(FIXTURES / "swift_output" / "v0-20261129-210000", first)
    beside = out / "v1-20261129-220000"
    shutil.copytree(first, beside)
    os.utime(beside / "logging.jsonl", (1, 1))
    source = open_watch_source(out)
    assert source.path == first and source.root == out and source.runs_seen == {first, beside}
    assert newer_run(source) is None
    os.utime(beside / "logging.jsonl")  # the other run writes: newest by its last write, but not new
    assert open_watch_source(out).path == beside and newer_run(source) is None
    started = out / "v2-20261130-090000"
    shutil.copytree(first, started)
    later = (beside / "logging.jsonl").stat().st_mtime + 1
    os.utime(started / "logging.jsonl", (later, later))  # it writes now
    newer = newer_run(source)
    assert newer is not None and newer.path == started and newer.root == out
    assert newer_run(newer) is None
    assert open_watch_source(first).root is None  # a run folder named: no folder above it to follow
    result = run_cli("watch", str(out), "--json", home=tmp_path)
    data = json.loads(result.stdout)
    assert data["dir"] == str(started) and data["root"] == str(out)
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))
    monkeypatch.setattr("core.cli._on_a_terminal", lambda: True)  # as from a terminal (pytest pipes stdout)
    outcome = dispatch(["watch", str(out)])
    assert isinstance(outcome, OpenApp) and outcome.open_run == str(out)


def test_llamafactory_board_saves_dir_opens_its_newest_run(tmp_path):
    """LLaMA-Board saves each run as saves/<model>/<method>/train_<date>/: `watch saves/<model>/lora` said
    "not a LLaMA-Factory output directory"; it opens the newest run below, as for ms-swift's vN-…/."""
    import os

    method_dir = tmp_path / "saves" / "Llama-3.2-1B-Instruct" / "lora"
    older = method_dir / "train_2026-11-29-20-00-00"
    newer = method_dir / "train_2026-11-29-21-00-00"
    shutil.copytree(FIXTURES / "llamafactory_output", older)
    shutil.copytree(older, newer)
    os.utime(older / "trainer_log.jsonl", (1, 1))
    for folder in (method_dir, method_dir.parent):
        source = open_watch_source(folder)
        assert source.kind == LLAMAFACTORY and source.path == newer
        assert source.log_path == newer / "running_log.txt" and source.facts["method"] == "lora"


def test_llamafactory_output_dir():
    source = open_watch_source(FIXTURES / "llamafactory_output")
    assert source.kind == LLAMAFACTORY and source.log_path.name == "running_log.txt"
    assert source.facts == {"model": "meta-llama/Llama-3.2-1B-Instruct", "method": "lora", "precision": "bf16"}


def test_unknown_and_missing_dirs_say_what_was_expected(tmp_path):
    with pytest.raises(SourceNotFound, match="logging.jsonl"):
        open_watch_source(tmp_path)
    with pytest.raises(SourceNotFound, match="no such directory"):
        open_watch_source(tmp_path / "nope")


def test_a_folder_that_cannot_be_listed_says_so_not_that_it_is_of_no_known_kind(tmp_path, monkeypatch):
    """Another user's 0700 output folder read "not a tunedeck run, ms-swift, LLaMA-Factory or HF Trainer output
    directory (looked for …)": none of its files could be seen. This box runs as root (chmod denies nothing):
    the listing is refused as the kernel would."""
    import os

    out = tmp_path / "lf"
    shutil.copytree(FIXTURES / "llamafactory_output", out)
    real_scandir = os.scandir

    def scandir(path="."):
        if Path(path) == out:
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(SourceNotFound) as caught:
        open_watch_source(out)
    assert str(caught.value).startswith(f"{out} cannot be read (Permission denied)") and "permissions" in str(caught.value)
    assert caught.value.exit_code == 2


def test_figures():
    assert format_duration(59) == "0:59" and format_duration(3723) == "1:02:03"
    assert format_duration(200_000) == "2d 07h" and format_duration(None) is None
    header = header_record(100)
    params = model_parameters(header)
    assert 4e9 < params < 6e9  # 28 layers of 3584 plus embeddings: a 7B-class shape, roughly
    value = mfu({"tokens_per_s": 12000.0}, header, 2, "NVIDIA H200")
    assert value == pytest.approx(6 * params * 12000 / (989e12 * 2))
    # a tunedeck run records its method's FLOPs per token (LoRA: about 4·params, not 6)
    recorded = {**header, "model_flops_per_token": 3.5e10}
    assert mfu({"tokens_per_s": 12000.0}, recorded, 2, "NVIDIA H200") == pytest.approx(3.5e10 * 12000 / (989e12 * 2))
    assert mfu({"tokens_per_s": 1.0, "mfu": 0.42}, {}, 1, None) == 0.42
    assert mfu({"tokens_per_s": 1.0}, {}, 1, "Some GPU") is None
    assert cost_so_far(7200, 4, 2.5) == pytest.approx(20.0) and cost_so_far(7200, 4, 0.0) is None


def test_steady_tokens_per_s_leaves_the_warm_up_and_one_noisy_interval_out():
    """The runs list, status and the dashboard's header showed the last interval's tokens/s: 3,100 after a
    save, 14,000 the interval after. The rate over the steady steps: tokens since the first interval over
    their time."""
    first = {"kind": "train", "step": 10, "tokens_per_s": 2500.0, "tokens_seen": 100_000, "elapsed_s": 40.0}
    at_save = {"kind": "train", "step": 500, "tokens_per_s": 3100.0, "tokens_seen": 5_000_000, "elapsed_s": 530.0}
    assert steady_tokens_per_s(first, at_save) == pytest.approx(4_900_000 / 490.0)  # 10,000, not 3,100
    # until a second interval is logged: the only one there is
    assert steady_tokens_per_s(first, first) == 2500.0 and steady_tokens_per_s(None, first) == 2500.0
    # another trainer's records carry no running totals: the interval's rate
    assert steady_tokens_per_s({"tokens_per_s": 5.0}, {"tokens_per_s": 7.0}) == 7.0
    # a resume that went back before the first record: its totals are behind it
    rewound = {"kind": "train", "step": 5, "tokens_per_s": 900.0, "tokens_seen": 50_000, "elapsed_s": 20.0}
    assert steady_tokens_per_s(first, rewound) == 900.0
    assert steady_tokens_per_s(first, {"kind": "resumed", "step": 800}) is None


def test_directory_size(tmp_path):
    (tmp_path / "a").write_bytes(b"x" * 1000)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b").write_bytes(b"y" * 24)
    assert directory_size(tmp_path) == 1024


@dataclass
class Summary:
    id: str
    status: str


def test_runs_ended_since_last_visit(tmp_path):
    path = tmp_path / "seen.json"
    assert runs_ended_since([Summary("a", "running"), Summary("b", "finished")], path) == []  # first visit
    ended = runs_ended_since([Summary("a", "crashed"), Summary("b", "finished"), Summary("c", "failed")], path)
    assert [s.id for s in ended] == ["a", "c"]
    assert runs_ended_since([Summary("a", "crashed")], path) == []
    assert json.loads(path.read_text()) == {"runs": {"a": "crashed"}}


def run_cli(*args, home):
    return subprocess.run([sys.executable, "-m", "core", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={"TUNEDECK_HOME": str(home), "PATH": "/usr/bin:/bin"})


def test_watch_cli_json_and_errors(tmp_path):
    result = run_cli("watch", str(FIXTURES / "llamafactory_output"), "--json", home=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["kind"] == "llamafactory"
    build_run(tmp_path / "runs", "20261129-2100-mine", status="finished", steps=5, total=5)
    result = run_cli("watch", "20261129-2100", "--json", home=tmp_path)
    assert result.returncode == 0 and json.loads(result.stdout)["kind"] == "tunedeck"
    result = run_cli("watch", str(tmp_path / "nope"), home=tmp_path)
    assert result.returncode == 2 and "no such directory" in result.stderr and result.stdout == ""
    result = run_cli("watch", "zzz", home=tmp_path)
    assert result.returncode == 2 and "zzz" in result.stderr


def test_watch_on_a_metric_file_watches_its_folder(tmp_path):
    """`watch out/v0-…/logging.jsonl` (the file the trainer printed it writes) said "no such directory" of a
    file that is there; the folder it is in is watched."""
    result = run_cli("watch", str(FIXTURES / "llamafactory_output" / "trainer_log.jsonl"), "--json", home=tmp_path)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["kind"] == "llamafactory" and data["dir"] == str(FIXTURES / "llamafactory_output")


def test_watch_on_a_llamafactory_log_removed_by_a_new_run_watches_that_run(tmp_path):
    """`watch out/trainer_log.jsonl` just after LLaMA-Factory removed it (a run started again with
    overwrite_output_dir, its first line minutes away) said "no such directory"; the folder is watched as
    LLaMA-Factory's, its state running, and no figures yet. A file named in a folder that is not there still says
    so."""
    out = tmp_path / "out"
    shutil.copytree(FIXTURES / "llamafactory_output", out)
    (out / "trainer_log.jsonl").unlink()
    result = run_cli("watch", str(out / "trainer_log.jsonl"), "--json", home=tmp_path / "home")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["kind"] == "llamafactory" and data["dir"] == str(out) and data["latest"] == {}
    assert data["state"]["status"] == "running"
    # the app opens the folder itself: known as LLaMA-Factory's by what its runs leave there (training_args.yaml)
    assert open_watch_source(out).kind == LLAMAFACTORY
    result = run_cli("watch", str(tmp_path / "nope" / "trainer_log.jsonl"), "--json", home=tmp_path / "home")
    assert result.returncode == 2 and "no such directory" in result.stderr


def test_core_watch_leaves_textual_and_rich_out():
    probe = ("import sys, json\nimport core.watch.feed, core.watch.alerts, core.watch.source, core.watch.last_seen,"
             " core.watch.figures, core.watch.commands\nprint(json.dumps(sorted(sys.modules)))")
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    loaded = {name.split(".")[0] for name in json.loads(result.stdout)}
    assert "core" in loaded and not {"textual", "rich", "torch", "pynvml"} & loaded


def test_a_run_the_app_showed_finishing_is_not_announced_at_the_next_start(tmp_path):
    """The app announced "since your last visit, run X ended: finished" for a run the user watched finish
    in it: the runs list now records a run it shows going from live to final."""
    from core.watch.last_seen import EndsSeen

    path = tmp_path / "seen.json"
    runs_ended_since([Summary("a", "running"), Summary("b", "running"), Summary("old", "finished")], path)  # start
    seen = EndsSeen(path)
    assert seen.shown([Summary("a", "running"), Summary("b", "running")]) == []
    ended = seen.shown([Summary("a", "finished"), Summary("b", "running")])  # watched it finish
    assert [s.id for s in ended] == ["a"]
    assert seen.shown([Summary("a", "finished"), Summary("b", "running")]) == []  # once
    assert json.loads(path.read_text())["runs"] == {"a": "finished", "b": "running", "old": "finished"}
    # next start: b ended while the app was closed (news), a was watched (not news)
    later = runs_ended_since([Summary("a", "finished"), Summary("b", "crashed"), Summary("old", "finished")], path)
    assert [s.id for s in later] == ["b"]
    fresh = EndsSeen(tmp_path / "never.json")  # before any first visit nothing is written
    fresh.shown([Summary("z", "running")])
    fresh.shown([Summary("z", "finished")])
    assert not (tmp_path / "never.json").exists()


def test_watch_json_carries_the_memory_and_step_rate_another_trainer_logs(tmp_path):
    """ms-swift's memory(GiB) and train_speed(iter/s) were read and never given out: `watch --json` has the
    newest train record's figures (what the dashboard's stats line shows), those among them."""
    result = run_cli("watch", str(FIXTURES / "swift_output"), "--json", home=tmp_path)
    assert result.returncode == 0, result.stderr
    latest = json.loads(result.stdout)["latest"]
    assert latest["memory_gib"] == 15.46 and latest["steps_per_s"] == 0.125 and latest["step"] == 100
    assert "tokens_per_s" not in latest  # ms-swift does not log it: left out, not null
    result = run_cli("watch", str(FIXTURES / "llamafactory_output"), "--json", home=tmp_path)
    assert json.loads(result.stdout)["latest"]["tokens_per_s"] == 1943.2


def test_watch_json_gives_a_runs_tokens_per_s_over_its_steady_steps_as_the_header_does(tmp_path):
    """`watch RUN --json` gave the last interval's tokens/s (12,599.6) where the dashboard's header, the runs
    list and `status` all say the rate over the steady steps (12,000): one run, two speeds."""
    from core.runs import RunDirectory
    from core.runs.listing import steady_rate

    path = build_run(tmp_path / "runs", "20261129-2100-mine", status="finished", steps=240, total=240)
    result = run_cli("watch", str(path), "--json", home=tmp_path)
    assert result.returncode == 0, result.stderr
    latest = json.loads(result.stdout)["latest"]
    run = RunDirectory(path)
    assert latest["tokens_per_s"] == pytest.approx(steady_rate(run, run.latest_metrics())) == 12000.0


def test_watch_waits_for_the_first_records_of_an_output_folder_still_empty(tmp_path):
    """``watch DIR`` on the output folder of a training that is starting (nothing written into it yet) exited 2
    at once, "not a … output directory". It now says it waits, once, and opens the folder when its first
    records come, as ``tail -F`` would. No real sleeping: the wait's sleep is the gate the test steps through."""
    import threading

    from core.watch.source import wait_for_source

    out = tmp_path / "out"
    out.mkdir()
    said: list[str] = []
    waits = threading.Semaphore(0)
    go_on = threading.Event()

    def sleep(_seconds):
        waits.release()  # the wait has looked once more and found nothing
        assert go_on.wait(60)
        go_on.clear()

    found: list = []
    waiter = threading.Thread(target=lambda: found.append(wait_for_source(out, lambda e: said.append(e.message),
                                                                          sleep=sleep)))
    waiter.start()
    for _ in range(2):  # still nothing: it goes on waiting, and says so once
        assert waits.acquire(timeout=60)
        go_on.set()
    assert waits.acquire(timeout=60)
    shutil.copy(FIXTURES / "llamafactory_output" / "trainer_log.jsonl", out / "trainer_log.jsonl")
    go_on.set()
    waiter.join(60)
    assert not waiter.is_alive() and found[0].kind == LLAMAFACTORY and found[0].path == out
    assert len(said) == 1 and str(out) in said[0]


def test_watch_does_not_wait_for_a_folder_that_is_not_there(tmp_path):
    """Only a folder that is there is waited for: a mistyped one is said at once (exit 2), as is a folder with
    nothing to read yet under ``--json`` (what is there now)."""
    from core.watch.source import wait_for_source

    with pytest.raises(SourceNotFound, match="no such directory"):
        wait_for_source(tmp_path / "nope", lambda e: pytest.fail("waited"), sleep=lambda s: pytest.fail("waited"))
    (tmp_path / "empty").mkdir()
    result = run_cli("watch", str(tmp_path / "empty"), "--json", home=tmp_path / "home")
    assert result.returncode == 2 and "not a tunedeck run" in result.stderr and result.stdout == ""
