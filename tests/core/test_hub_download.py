"""Detached downloads against the fake hub: complete, dropped-then-resumed, killed-then-resumed, refused."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from core.atomic_file import write_json_atomic
from core.hub.download import (
    SPAWNED_FILE,
    check_disk,
    downloader_alive,
    job_dir_for,
    plan_download,
    read_status,
    start_download,
    wait_for_download,
)
from core.hub.errors import NotEnoughDiskError
from core.hub.source import open_hub
from core.runs.liveness import process_start_time
from tests.hubserver import TOKEN, FakeHubServer, standard_hub

WEIGHTS = bytes(range(256)) * 1024


@pytest.fixture
def hub_server(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "ms"))
    monkeypatch.setenv("MODELSCOPE_HOME", str(tmp_path / "ms-home"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    for name in ("MODELSCOPE_API_TOKEN", "HF_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    with FakeHubServer(standard_hub()) as server:
        monkeypatch.setenv("MODELSCOPE_ENDPOINT", server.url)
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


def _plan(hub="modelscope", model="Qwen/Qwen2.5-Tiny-Instruct", include=None):
    source = open_hub(hub)
    return plan_download(source, source.details(model), include)


@pytest.mark.parametrize("hub", ["modelscope", "hf"])
def test_download_skips_other_weight_formats_and_verifies(hub_server, hub):
    plan = _plan(hub)
    assert "pytorch_model.bin" in {f.path for f in plan.skipped}
    job = start_download(plan)
    status = wait_for_download(job, 30)
    assert status.status == "done", status
    assert status.bytes_done == status.bytes_total == plan.total_bytes
    weights = plan.target_dir / "model.safetensors"
    assert hashlib.sha256(weights.read_bytes()).hexdigest() == hashlib.sha256(WEIGHTS).hexdigest()
    assert not (plan.target_dir / "pytorch_model.bin").exists()
    assert not list(plan.target_dir.rglob("*.part"))
    events = [json.loads(line)["event"] for line in (job / "events.jsonl").read_text().splitlines()]
    assert events[0] == "start" and events[-1] == "done"
    if hub == "hf":  # the cache layout transformers resolves: refs/main -> snapshots/<sha>
        assert (plan.target_dir.parent.parent / "refs" / "main").read_text() == plan.target_dir.name


def test_modelscope_files_land_where_the_estimator_finds_them(hub_server):
    plan = _plan()
    wait_for_download(start_download(plan), 30)
    from core.estimate import load_model_config

    config = load_model_config("Qwen/Qwen2.5-Tiny-Instruct")
    assert config.config["hidden_size"] == 64 and str(plan.target_dir) in config.source


def test_dropped_connection_resumes_with_a_range_request(hub_server):
    hub_server.hub.drop_once.add("model.safetensors")
    plan = _plan()
    status = wait_for_download(start_download(plan), 30)
    assert status.status == "done", status
    assert (plan.target_dir / "model.safetensors").read_bytes() == WEIGHTS
    ranges = [r for _, path, r in hub_server.hub.requests if r]
    assert ranges and int(ranges[0].split("=")[1].split("-")[0]) > 0  # resumed mid-file, not restarted
    events = (job_dir_for("modelscope", plan.model_id) / "events.jsonl").read_text()
    assert '"retry"' in events


def _partial_size(plan) -> int:
    part = plan.target_dir / "model.safetensors.part"
    return part.stat().st_size if part.is_file() else 0


def _wait_until_stalled(job, plan) -> None:
    """The downloader has written the bytes before the fake hub's stall and now waits for the rest."""
    deadline = time.monotonic() + 60  # a hang guard for a slow interpreter start, not a speed
    while time.monotonic() < deadline:
        status = read_status(job)
        if status and status.pid and _partial_size(plan) >= 64 * 1024:
            return
        time.sleep(0.05)
    raise AssertionError(f"the download never reached the stall: {read_status(job)}")


def test_killed_downloader_resumes_from_its_partial_file(hub_server):
    hub_server.hub.stall_at = 128 * 1024  # the file body holds its second half until the kill has landed
    plan = _plan(include=["model.safetensors"])
    job = start_download(plan)
    _wait_until_stalled(job, plan)
    status = read_status(job)
    # Its own session: a hang-up of this terminal (a dropped SSH) does not reach it.
    assert os.getsid(status.pid) == status.pid != os.getsid(0)
    os.kill(status.pid, signal.SIGKILL)  # what a reboot or OOM kill does; a closed SSH does less
    deadline = time.monotonic() + 10
    while downloader_alive(job) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert read_status(job).status == "interrupted"
    partial = _partial_size(plan)
    assert 0 < partial <= 128 * 1024 < len(WEIGHTS)
    hub_server.hub.stall_at = None
    hub_server.hub.stall_release.set()  # the killed download's handler ends on a closed socket
    status = wait_for_download(start_download(plan), 30)
    assert status.status == "done"
    assert (plan.target_dir / "model.safetensors").read_bytes() == WEIGHTS
    assert any(r == f"bytes={partial}-" for _, _, r in hub_server.hub.requests)


def test_a_downloader_still_starting_is_queued_however_long_it_takes(hub_server):
    """On a loaded box the spawned interpreter can take many seconds to import and take the job's lock:
    while that process lives the job is queued, not interrupted; once it is gone (a zombie counts as
    gone) without having locked, it is interrupted at once."""
    import psutil

    plan = _plan(include=["model.safetensors"])
    job = job_dir_for(plan.hub, plan.model_id)
    job.mkdir(parents=True)
    write_json_atomic(job / "job.json", plan.to_json())
    write_json_atomic(job / "state.json", {"status": "queued", "updated": time.time() - 600})
    # A stand-in for the spawned downloader that never gets as far as the lock.
    stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        write_json_atomic(job / SPAWNED_FILE, {"pid": stand_in.pid, "started_at": process_start_time(stand_in.pid)})
        assert read_status(job).status == "queued"  # ten minutes after it was queued, and still starting
        stand_in.kill()
        deadline = time.monotonic() + 60  # a hang guard for the kill to land, not a speed
        while psutil.Process(stand_in.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.05)
        assert read_status(job).status == "interrupted"  # dead, not yet reaped
    finally:
        stand_in.kill()
        stand_in.wait()
    assert read_status(job).status == "interrupted"
    # a pid that another program now holds (another start time) is not the downloader
    write_json_atomic(job / SPAWNED_FILE, {"pid": os.getpid(), "started_at": 1.0})
    assert read_status(job).status == "interrupted"


def test_a_downloader_that_ends_while_its_status_is_read_reads_as_its_last_state(hub_server, monkeypatch):
    """``read_status`` reads the state, then asks whether the downloader lives. A downloader that writes
    its last state and exits between the two read "interrupted" (CI saw a cancelled download so): the
    state is read again once the downloader is known gone. The interleaving is forced with a real
    process that holds the job's lock, finishes when told, and exits."""
    import core.hub.download as download

    plan = _plan(include=["model.safetensors"])
    job = job_dir_for(plan.hub, plan.model_id)
    job.mkdir(parents=True)
    write_json_atomic(job / "job.json", plan.to_json())
    write_json_atomic(job / "state.json", {"status": "running", "updated": time.time()})
    finisher = subprocess.Popen(
        [sys.executable, "-c", (
            "import fcntl, sys, time\n"
            "from core.atomic_file import write_json_atomic\n"
            "lock = open(sys.argv[1] + '/lock', 'a+'); fcntl.flock(lock, fcntl.LOCK_EX)\n"
            "print('locked', flush=True); sys.stdin.readline()\n"
            "write_json_atomic(sys.argv[1] + '/state.json', {'status': 'cancelled', 'updated': time.time()})\n"
        ), str(job)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        assert finisher.stdout.readline().strip() == "locked"
        real_alive = download.downloader_alive
        calls = []

        def alive_after_the_downloader_ends(job_dir):
            if not calls:  # the first check: the downloader writes its last state and exits just now
                finisher.stdin.write("go\n")
                finisher.stdin.flush()
                finisher.wait(60)
            calls.append(job_dir)
            return real_alive(job_dir)

        monkeypatch.setattr(download, "downloader_alive", alive_after_the_downloader_ends)
        assert read_status(job).status == "cancelled"
        assert finisher.returncode == 0
    finally:
        finisher.kill()
        finisher.wait()


def test_cancel_stops_and_keeps_the_partial_file(hub_server):
    hub_server.hub.stall_at = 128 * 1024
    plan = _plan(include=["model.safetensors"])
    job = start_download(plan)
    _wait_until_stalled(job, plan)
    from core.hub.download import cancel_download

    assert cancel_download(job)
    hub_server.hub.stall_release.set()  # the next chunk arrives after the cancel file: it stops there
    status = wait_for_download(job, 30)
    assert status.status == "cancelled"
    assert 0 < _partial_size(plan) < len(WEIGHTS)


def test_private_download_needs_the_token_and_never_writes_it(hub_server, monkeypatch):
    monkeypatch.setenv("MODELSCOPE_API_TOKEN", TOKEN)
    plan = _plan(model="acme/private-model")
    job = start_download(plan, TOKEN)
    assert wait_for_download(job, 30).status == "done"
    for path in job.rglob("*"):
        if path.is_file():
            assert TOKEN not in path.read_text(errors="replace"), path


def test_lost_access_fails_with_the_reason(hub_server, monkeypatch):
    monkeypatch.setenv("MODELSCOPE_API_TOKEN", TOKEN)
    plan = _plan(model="acme/private-model")
    status = wait_for_download(start_download(plan, token=None), 30)  # no token for the downloader
    assert status.status == "failed" and "401" in status.error


@pytest.mark.parametrize("hub", ["modelscope", "hf"])
def test_a_web_page_in_place_of_the_files_fails_the_download_saying_so(hub_server, hub):
    """The QA's box fell behind a captive portal mid-download: every file answered 200 with its login page,
    which never matched the file's size, so the downloader fetched it again without pause or end (170
    requests in 8 s, "running" with 0 bytes). It fails at once naming the web page and what to do."""
    plan = _plan(hub)
    hub_server.hub.web_page = True
    before = len(hub_server.hub.requests)
    status = wait_for_download(start_download(plan), 30)
    assert status.status == "failed", status
    assert status.error.startswith("README.md came as a web page: "), status.error
    assert "captive portal" in status.error and "run the download again to resume" in status.error
    assert len(hub_server.hub.requests) - before == 1  # the first file's page, not fetched again


@pytest.mark.parametrize("hub", ["modelscope", "hf"])
def test_a_404_web_page_in_place_of_a_file_is_said_to_be_a_web_page_not_a_missing_file(hub_server, hub):
    """A proxy or a website at the endpoint answered the file's URL with its HTML "Not Found" page: the
    download failed saying the file "does not exist (404)", though the hub never said so. It says the
    address answered with a web page, names the URL and what to do (the endpoint variable that is set)."""
    plan = _plan(hub)
    hub_server.hub.web_page, hub_server.hub.web_page_status = True, 404
    status = wait_for_download(start_download(plan), 30)
    assert status.status == "failed", status
    assert "does not exist" not in status.error, status.error
    assert status.error.startswith("README.md came as a web page (HTTP 404) from " + hub_server.url), status.error
    assert "answered HTTP 404 with a web page" in status.error
    env = {"modelscope": "MODELSCOPE_ENDPOINT", "hf": "HF_ENDPOINT"}[hub]
    assert env in status.error, status.error


@pytest.mark.parametrize("status", [401, 403])
@pytest.mark.parametrize("hub", ["modelscope", "hf"])
def test_a_login_web_page_in_place_of_a_file_is_said_to_be_a_web_page_not_a_token_problem(hub_server, hub, status):
    """A proxy's or a captive portal's login page answered the file's URL with HTTP 401 or 403: the download
    failed saying the model "needs a login (401): it is private or gated. Set MODELSCOPE_API_TOKEN …" (or access
    "denied (403)"), though no hub said so and no token gets past a portal. It now says the address answered with
    a web page (a login page), names the URL and gives the web page's advice, as the 404 page has it."""
    plan = _plan(hub)
    hub_server.hub.web_page, hub_server.hub.web_page_status = True, status
    state = wait_for_download(start_download(plan), 30)
    assert state.status == "failed", state
    assert state.error.startswith(f"README.md came as a web page (HTTP {status}) from " + hub_server.url), state.error
    assert f"answered HTTP {status} with a web page, not its API: a proxy's or a captive portal's login page" \
        in state.error, state.error
    assert "needs a login" not in state.error and "access to" not in state.error and "TOKEN" not in state.error
    env = {"modelscope": "MODELSCOPE_ENDPOINT", "hf": "HF_ENDPOINT"}[hub]
    assert env in state.error, state.error


@pytest.mark.parametrize("hub", ["modelscope", "hf"])
def test_a_cdns_403_page_for_an_expired_download_link_is_said_to_be_the_link_and_tried_again(hub_server, hub):
    """The hubs send a file from a CDN through a signed link that expires. The CDN's HTML 403 page (an expired
    or refused link) was taken for a proxy's or a captive portal's login page: the download failed at once,
    "no hub token gets past it", check your proxy. It is now the link: tried again (each try asks the hub for
    a new link), so one refusal costs a retry; a CDN that keeps refusing fails the download naming its host,
    the link and what to do, no login nor token. The fake hub's files come through a 302 to "localhost"."""
    from urllib.parse import urlsplit

    hub_server.hub.cdn = True
    plan = _plan(hub)
    hub_server.hub.cdn_refusals = 1  # the downloader's first link refused: a retry gets a new one
    status = wait_for_download(start_download(plan), 60)
    assert status.status == "done", status
    assert (plan.target_dir / "model.safetensors").read_bytes() == WEIGHTS

    plan = _plan(hub, include=["config.json"])
    hub_server.hub.cdn_refusals = -1  # it refuses every link
    other = plan.target_dir / "config.json"
    other.unlink()
    state = wait_for_download(start_download(plan), 90)
    assert state.status == "failed", state
    cdn = f"localhost:{urlsplit(hub_server.url).port}"
    assert state.error.startswith(f"Gave up on config.json after 6 attempts without progress: {cdn} refused the "
                                  "download link the hub gave for config.json (HTTP 403): a signed link that expired "
                                  "or was refused by that storage server"), state.error
    assert "Run the download again" in state.error, state.error
    assert "captive portal" not in state.error and "TOKEN" not in state.error and "needs a login" not in state.error


@pytest.mark.parametrize("hub", ["modelscope", "hf"])
def test_files_a_mirror_labels_text_html_are_downloaded(hub_server, hub):
    """A mirror that labels every file text/html had each refused as a captive portal's page. The first
    bytes are looked at before any is written: files are downloaded; a page is still refused (above)."""
    plan = _plan(hub)
    hub_server.hub.label_html = True
    status = wait_for_download(start_download(plan), 30)
    assert status.status == "done", status
    assert (plan.target_dir / "model.safetensors").read_bytes() == WEIGHTS


def test_not_enough_disk_refuses_with_numbers(hub_server):
    from dataclasses import replace

    from core.hub.records import RepoFile

    plan = _plan()
    huge = replace(plan, files=(RepoFile("model.safetensors", 10**18, None),), urls=("http://x",))
    with pytest.raises(NotEnoughDiskError) as error:
        check_disk(huge)
    assert error.value.needed_bytes == 10**18 and error.value.free_bytes > 0
    assert " TB" in str(error.value) and str(plan.target_dir) in str(error.value)


def test_file_gone_from_the_hub_fails_with_the_reason(hub_server):
    plan = _plan()
    del hub_server.hub.repos["Qwen/Qwen2.5-Tiny-Instruct"].files["tokenizer.json"]
    status = wait_for_download(start_download(plan), 30)
    assert status.status == "failed" and "404" in status.error and "tokenizer.json" in status.error


def test_a_cancelled_download_is_listed_incomplete_and_refused_for_training(hub_server, capsys):
    """A stopped download leaves config.json and a ``model.safetensors.part``: ``models list`` sets it
    apart with the command that resumes it, and ``model_problem`` (train, train --check) refuses its
    folder and its id, instead of a run that would start from random weights."""
    from core.cli import main
    from core.config.model_checks import model_problem
    from core.hub.download import cancel_download
    from core.lifecycle.source import LifecycleError, check_model_dir

    hub_server.hub.stall_at = 128 * 1024
    plan = _plan()
    job = start_download(plan)
    _wait_until_stalled(job, plan)
    assert cancel_download(job)
    hub_server.hub.stall_release.set()
    assert wait_for_download(job, 30).status == "cancelled"
    assert (plan.target_dir / "config.json").is_file()

    assert main(["models", "list", "--json"]) == 0
    [listed] = json.loads(capsys.readouterr().out)["models"]
    assert listed["id"] == "Qwen/Qwen2.5-Tiny-Instruct" and listed["has_config"]
    assert listed["complete"] is False and listed["partial"] is True and listed["download"] == "cancelled"
    assert main(["models", "list"]) == 0
    out, err = capsys.readouterr()
    assert "Models on disk" not in err and "Incomplete" in err
    assert "download cancelled; download not finished (1 .part file): " \
           "tunedeck models download Qwen/Qwen2.5-Tiny-Instruct resumes it" in out

    for name in (str(plan.target_dir), "Qwen/Qwen2.5-Tiny-Instruct"):
        severity, message = model_problem(name, "modelscope", probe=False)
        assert severity == "error" and "not finished (1 .part/.incomplete file)" in message and "random weights" in message
        assert "tunedeck models download Qwen/Qwen2.5-Tiny-Instruct resumes it" in message
    # serve / chat --model-dir on the folder: refused by the same look, in words of loading, not training
    with pytest.raises(LifecycleError) as caught:
        check_model_dir(plan.target_dir)
    said = str(caught.value)
    assert said.startswith(f"--model-dir {plan.target_dir} holds a download that is not finished") and \
        "tunedeck models download Qwen/Qwen2.5-Tiny-Instruct resumes it" in said and "random weights" not in said


def test_the_cli_resumes_an_unfinished_download_with_the_files_it_was_started_with(hub_server, capsys):
    """``models download ID`` after a cancelled ``--include '*'`` download fetches every file again, not the
    one weight format a fresh download picks; ``--include`` still chooses afresh."""
    from core.cli import main
    from core.hub.download import cancel_download

    hub_server.hub.stall_at = 128 * 1024
    plan = _plan(include=["*"])
    assert "pytorch_model.bin" in {f.path for f in plan.files}
    job = start_download(plan)
    _wait_until_stalled(job, plan)
    assert cancel_download(job)
    hub_server.hub.stall_release.set()
    assert wait_for_download(job, 30).status == "cancelled"
    hub_server.hub.stall_at = None

    assert main(["models", "download", "Qwen/Qwen2.5-Tiny-Instruct"]) == 0
    err = capsys.readouterr().err
    assert "Going on with the files the cancelled download was started with" in err
    assert (plan.target_dir / "pytorch_model.bin").is_file()
    assert (plan.target_dir / "model.safetensors").read_bytes() == WEIGHTS
    # finished: the next plain download is a fresh choice (one format), said as such
    assert main(["models", "download", "Qwen/Qwen2.5-Tiny-Instruct"]) == 0
    assert "Going on with" not in capsys.readouterr().err


def test_the_cli_refuses_include_while_a_download_of_the_model_runs(hub_server, capsys):
    """The QA's `download ID --include '*.json'` while ID downloaded said "Downloading 1 files … Started"; the
    running downloader was left alone (start_download does) and fetched its own files. Refused (exit 2), with
    how to go on; the running download is not touched."""
    from core.cli import main
    from core.hub.download import cancel_download

    hub_server.hub.stall_at = 128 * 1024
    plan = _plan()
    job = start_download(plan)
    _wait_until_stalled(job, plan)
    try:
        assert main(["models", "download", "Qwen/Qwen2.5-Tiny-Instruct", "--include", "*.json", "--detach"]) == 2
        err = capsys.readouterr().err
        assert "A download of Qwen/Qwen2.5-Tiny-Instruct is running" in err and "--cancel" in err, err
        assert "Started" not in err and read_status(job).active
        # without --include a second --detach attaches to it, and says so (it said "Started")
        assert main(["models", "download", "Qwen/Qwen2.5-Tiny-Instruct", "--detach"]) == 0
        err = capsys.readouterr().err
        assert "Already under way (started earlier)" in err and "Started" not in err, err
    finally:
        cancel_download(job)
        hub_server.hub.stall_release.set()
        wait_for_download(job, 30)


def test_a_second_download_of_a_running_one_follows_it_and_never_refuses_for_disk(hub_server, capsys, monkeypatch):
    """The QA ran `models download ID` again while ID downloaded in another terminal: it planned afresh, counted
    the free space the running download had already taken and refused ("Not enough disk"). It follows the
    running download instead (its progress to the end), and `--detach` says it runs; no disk check."""
    from core.cli import main
    from core.hub import commands, download

    hub_server.hub.stall_at = 128 * 1024
    plan = _plan()
    job = start_download(plan)
    _wait_until_stalled(job, plan)
    monkeypatch.setattr(download, "free_bytes_at", lambda path: 0)  # the running download took the rest
    try:
        assert check_disk(plan, advice="app") == 0  # the app's `d` on it attaches too (start_download returns it)
        assert main(["models", "download", "Qwen/Qwen2.5-Tiny-Instruct", "--detach"]) == 0
        err = capsys.readouterr().err
        assert "Already under way" in err and "Not enough" not in err, err
        shown = []
        real_show = commands.ProgressPrinter.show

        def show_then_release(self, status):  # the follower shows the running job's progress, then it ends
            shown.append(status)
            hub_server.hub.stall_release.set()
            real_show(self, status)

        monkeypatch.setattr(commands.ProgressPrinter, "show", show_then_release)
        assert main(["models", "download", "Qwen/Qwen2.5-Tiny-Instruct"]) == 0
        err = capsys.readouterr().err
        assert "following it" in err and "Not enough" not in err and "Done: Qwen/Qwen2.5-Tiny-Instruct" in err, err
        assert shown and shown[0].job_dir == job and read_status(job).status == "done"
    finally:
        cancel = download.cancel_download(job)
        hub_server.hub.stall_release.set()
        if cancel:
            wait_for_download(job, 30)


def test_deleting_a_model_removes_its_download_record_and_is_refused_while_it_downloads(hub_server, capsys):
    """After a delete, ``models list`` showed the download 'done' still, its record left behind; a model
    still downloading is not deleted under its downloader (refused with the way to stop it)."""
    from core.hub.download import cancel_download, list_downloads
    from core.hub.local import DeleteRefusedError, delete_local_model, list_local_models

    plan = _plan()
    job = start_download(plan)
    assert wait_for_download(job, 60).status == "done"
    [model] = list_local_models()
    assert [d.status for d in list_downloads()] == ["done"]
    assert delete_local_model(model) > 0
    assert list_downloads() == [] and not job.exists() and not plan.target_dir.exists()

    hub_server.hub.stall_at = 128 * 1024
    job = start_download(plan)
    _wait_until_stalled(job, plan)
    [model] = list_local_models()
    with pytest.raises(DeleteRefusedError, match=r"still downloading .*Qwen2.5-Tiny-Instruct --cancel"):
        delete_local_model(model)
    from core.cli import main

    # its CLI twin refuses alike, before asking, with the way to stop the download (exit 2, nothing deleted)
    assert main(["models", "rm", "Qwen/Qwen2.5-Tiny-Instruct", "--yes"]) == 2
    assert "Qwen2.5-Tiny-Instruct --cancel" in capsys.readouterr().err
    assert plan.target_dir.exists() and read_status(job).active
    assert cancel_download(job)
    hub_server.hub.stall_release.set()
    assert wait_for_download(job, 30).status == "cancelled"
    delete_local_model(list_local_models()[0])  # a stopped partial goes with its record too
    assert list_downloads() == [] and not plan.target_dir.exists()


@pytest.mark.parametrize("hub", ["modelscope", "hf"])
def test_a_failed_download_without_config_is_listed_by_the_id_its_record_gives(hub_server, hub, capsys):
    """A download that fails on its first file leaves an empty folder: no config.json, so the folder's name
    alone was not trusted and ``models list`` showed no name and ``tunedeck models download OWNER/NAME``,
    while ``--json`` (and the TUI) named the model from tunedeck's own record. The record gives the id and
    the hub: the line names the model and its resume command is one to copy."""
    from core.cli import main

    model = "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"
    plan = _plan(hub, model)
    assert [f.path for f in plan.files][0] == "README.md"
    del hub_server.hub.repos[model].files["README.md"]  # the first file fails: nothing lands
    status = wait_for_download(start_download(plan), 30)
    assert status.status == "failed" and not list(plan.target_dir.rglob("*.json"))

    assert main(["models", "list", "--json"]) == 0
    [listed] = json.loads(capsys.readouterr().out)["models"]
    assert listed["id"] == model and listed["download"] == "failed" and not listed["has_config"]
    assert main(["models", "list"]) == 0
    out, err = capsys.readouterr()
    assert "Incomplete (" in err and "OWNER/NAME" not in out
    lines = out.splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith(hub))
    assert lines[row].split()[:2] == [hub, model], lines[row]
    resume = f"tunedeck models download {model}" + (" --hub hf" if hub == "hf" else "")
    assert lines[row + 1].strip() == f"download failed; no config.json: {resume} resumes it, or delete the folder."


def test_a_download_whose_hub_goes_away_fails_with_its_whole_reason(hub_server):
    """The QA stopped the hub mid-download: the reason stored was cut at 200 characters, mid-word, before
    its cause ("…(Caused by NewConnecti. Run the download again to resume."). A reason of that length is
    kept whole, the cause at its end included, in state.json and events.jsonl alike."""
    model = "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"
    plan = _plan("modelscope", model)
    hub_server.stop()  # the hub goes away after the plan: every file request is refused
    job = start_download(plan)
    status = wait_for_download(job, 120)  # six attempts a file, with their back-off, before it gives up
    assert status.status == "failed", status
    error = status.error
    assert error.startswith("Gave up on README.md after 6 attempts without progress: ") and len(error) > 200
    assert "Connection refused" in error and error.endswith(". Run the download again to resume."), error
    assert json.loads((job / "state.json").read_text())["error"] == error
    events = [json.loads(line) for line in (job / "events.jsonl").read_text().splitlines()]
    assert events[-1] == {**events[-1], "event": "failed", "reason": error}
    assert all("Connection refused" in e["reason"] for e in events if e["event"] == "retry")


def test_a_server_that_keeps_answering_short_without_an_error_is_given_up_on_with_back_off(hub_server):
    """A server that answered each range request with a 206 of 0 bytes, no error, had the downloader ask again
    at once, without end: no back-off, never counted as an attempt without progress, the job "running"
    forever. It is now tried again as a dropped link is (back-off, the retry said in state.json) and given up
    on after the same six attempts without progress, the bytes that came kept for a resume."""
    from core.hub.download import MAX_STALLED_ATTEMPTS

    hub_server.hub.short_at = 128 * 1024  # the body ends there; past it, 206 with nothing
    plan = _plan(include=["model.safetensors"])
    asked_before = len(hub_server.hub.requests)  # the plan read config.json and the card
    job = start_download(plan)
    status = wait_for_download(job, 120)  # six attempts with their back-off, then it gives up
    assert status.status == "failed", status
    assert status.error == (f"Gave up on model.safetensors after {MAX_STALLED_ATTEMPTS} attempts without progress: "
                            f"the server ended the file at byte {128 * 1024} of {len(WEIGHTS)} without an error. "
                            "Run the download again to resume.")
    events = [json.loads(line) for line in (job / "events.jsonl").read_text().splitlines()]
    retries = [e for e in events if e["event"] == "retry"]
    # the first answer ended short with bytes (progress: not counted), then six ended with none
    assert [e["offset"] for e in retries] == [0] + [128 * 1024] * MAX_STALLED_ATTEMPTS
    fetched = [r for r in hub_server.hub.requests[asked_before:] if r[0] == "GET"]
    assert len(fetched) == 1 + MAX_STALLED_ATTEMPTS  # one a retry: the loop does not hammer the server
    assert _partial_size(plan) == 128 * 1024


def test_a_file_longer_on_the_hub_than_its_file_list_says_fails_instead_of_fetching_it_forever(hub_server):
    """A file uploaded again, larger, after the file list was read: the body was longer than the size the
    download expects, the longer part counted as progress, the next pass deleted it and fetched it again,
    without end ("running"). Bytes past the expected size are a fatal size mismatch that says what to do."""
    plan = _plan(include=["model.safetensors"])
    hub_server.hub.repos["Qwen/Qwen2.5-Tiny-Instruct"].files["model.safetensors"] = WEIGHTS + WEIGHTS
    asked_before = len(hub_server.hub.requests)
    status = wait_for_download(start_download(plan), 30)
    assert status.status == "failed", status
    assert status.error == (f"model.safetensors on the hub is larger than its file list says (more than "
                            f"{len(WEIGHTS)} bytes came): the file on the hub changed size since the download "
                            "started. The bytes that came were not kept: run the download again to fetch the new "
                            "file list."), status.error
    assert "ended" not in status.error
    fetched = [r for r in hub_server.hub.requests[asked_before:] if r[0] == "GET"]
    assert len(fetched) == 1  # not fetched again
    assert _partial_size(plan) == 0


def test_a_failed_download_shows_no_speed_or_time_left(hub_server, capsys):
    """A download that failed kept the last rate and ETA in its state.json: ``models list --json`` (and the
    app) showed a speed for a job that no longer moves. An end state has neither."""
    from core.cli import main

    hub_server.hub.chunk_delay_s = 0.5  # each 64 KiB chunk at least 0.5 s apart: a speed is measured
    plan = _plan(include=["model.safetensors", "tokenizer.json"])
    del hub_server.hub.repos["Qwen/Qwen2.5-Tiny-Instruct"].files["tokenizer.json"]  # the second file: 404
    job = start_download(plan)
    status = wait_for_download(job, 120)
    assert status.status == "failed" and status.bytes_done == len(WEIGHTS), status
    events = [json.loads(line)["event"] for line in (job / "events.jsonl").read_text().splitlines()]
    assert events.count("file_done") == 1  # it failed with a file behind it, a speed measured on the way
    state = json.loads((job / "state.json").read_text())
    assert (state["rate_bps"], state["eta_s"]) == (0.0, None)
    assert main(["models", "list", "--json"]) == 0
    [listed] = json.loads(capsys.readouterr().out)["downloads"]
    assert listed["status"] == "failed" and not listed["rate_bps"] and listed["eta_s"] is None


def test_a_reason_too_long_to_keep_is_cut_at_a_word_with_an_ellipsis():
    from core.hub.downloader import REASON_MAX_CHARS, bounded_reason

    words = " ".join(f"word{index:04d}" for index in range(200))  # 1,799 characters
    kept = bounded_reason(words)
    assert len(kept) <= REASON_MAX_CHARS and kept.endswith("…") and len(kept) > REASON_MAX_CHARS - 12
    assert kept[:-1] == words[:len(kept) - 1] and words[len(kept) - 1] == " "  # whole words only
    assert bounded_reason("short\n  reason") == "short reason"
    assert bounded_reason("x" * 1000) == "x" * (REASON_MAX_CHARS - 1) + "…"  # no word to cut at: still bounded


def _job_in_process(plan):
    """The job folder ``start_download`` writes, without its detached downloader: the test runs the
    ``Downloader`` here, where it can make the disk fail or the link drop."""
    job = job_dir_for(plan.hub, plan.model_id)
    job.mkdir(parents=True)
    write_json_atomic(job / "job.json", plan.to_json())
    return job


def _downloader_in_thread(job):
    """The job's ``Downloader`` run in a thread of this process, holding the job's lock as downloader.main holds
    it (the job reads as running): the thread, and a dict that gets the run's exit ``code``."""
    from core.hub import downloader

    ended = {}

    def run() -> None:
        with open(job / "lock", "a+") as lock:
            assert downloader._take_lock(lock)
            ended["code"] = downloader.Downloader(job, None).run()

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    return worker, ended


def test_a_full_disk_fails_the_download_at_once_saying_so(hub_server, monkeypatch):
    """The QA filled the disk mid-download: each ENOSPC was taken for a dropped link, retried six times with
    back-off, and the download ended "Gave up on … after 6 attempts without progress: [Errno 28] …. Run the
    download again to resume.", which cannot help. A write that fails on this box fails the job at once,
    naming the full disk, what is free and what to do; the part written stays for the resume."""
    import errno

    from core.hub import downloader

    plan = _plan(include=["model.safetensors"])
    job = _job_in_process(plan)
    real_open = open

    class FullDisk:
        """A .part file on a disk that fills after 64 KiB."""

        def __init__(self, path, mode):
            self.handle = real_open(path, mode)

        def write(self, data):
            if self.handle.tell() + len(data) > 64 * 1024:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.handle.write(data)

        def close(self):
            self.handle.close()

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.close()

    def fake_open(path, mode="r", *args, **kwargs):
        if str(path).endswith(".part"):
            return FullDisk(path, mode)
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(downloader, "open", fake_open, raising=False)
    monkeypatch.setattr(downloader.time, "sleep", lambda seconds: None)  # the back-off is not under test
    assert downloader.Downloader(job, None).run() == 2
    status = read_status(job)
    assert status.status == "failed", status
    assert status.error.startswith("The disk filled up while writing model.safetensors ("), status.error
    assert "Free some space" in status.error and str(plan.target_dir) in status.error
    events = [json.loads(line) for line in (job / "events.jsonl").read_text().splitlines()]
    assert not [e for e in events if e["event"] == "retry"], events  # no retry: a full disk stays full
    assert (plan.target_dir / "model.safetensors.part").stat().st_size == 64 * 1024  # kept for the resume


def test_a_really_full_disk_fails_the_download_and_it_resumes_once_space_is_freed(hub_server, tmp_path, monkeypatch):
    """The test above on a real filesystem (hardware: none; a size-limited tmpfs, which needs root, else
    skipped): the model cache is an 8 MB tmpfs filled to 100 KiB short of full under a 256 KiB file. The
    real ENOSPC fails the job at once with what is free and what to do, keeps the part written, and once
    the ballast is gone the download resumes from that part with a range request."""
    from core.hub import downloader
    from tests.fixtures.disk import fill, tmpfs

    cache = tmp_path / "ms-small"
    with tmpfs(cache, "8m"):
        monkeypatch.setenv("MODELSCOPE_CACHE", str(cache))
        plan = _plan(include=["model.safetensors"])
        assert str(plan.target_dir).startswith(str(cache))
        job = _job_in_process(plan)
        ballast = fill(cache, leave=100 * 1024)
        monkeypatch.setattr(downloader.time, "sleep", lambda seconds: None)  # the back-off is not under test
        assert downloader.Downloader(job, None).run() == 2
        status = read_status(job)
        assert status.status == "failed", status
        assert status.error.startswith("The disk filled up while writing model.safetensors ("), status.error
        assert str(plan.target_dir) in status.error and "Free some space" in status.error
        events = [json.loads(line)["event"] for line in (job / "events.jsonl").read_text().splitlines()]
        assert "retry" not in events
        written = (plan.target_dir / "model.safetensors.part").stat().st_size
        assert 0 < written < len(WEIGHTS)
        ballast.unlink()
        assert downloader.Downloader(job, None).run() == 0
        assert read_status(job).status == "done"
        assert (plan.target_dir / "model.safetensors").read_bytes() == WEIGHTS
        assert any(r == f"bytes={written}-" for _, _, r in hub_server.hub.requests)


def test_a_link_that_drops_after_progress_every_time_still_finishes(hub_server, monkeypatch):
    """Attempts that wrote bytes before the link dropped were counted as "without progress": a file whose
    link dropped mid-body seven times in a row failed ("Gave up … after 6 attempts without progress"), each
    attempt having brought a piece of it. Only attempts that bring nothing count towards giving up."""
    import requests

    from core.hub import downloader

    plan = _plan(include=["model.safetensors"])
    job = _job_in_process(plan)
    monkeypatch.setattr(downloader.time, "sleep", lambda seconds: None)  # the back-off is not under test
    piece = 32 * 1024  # eight drops for the 256 KiB file

    def dropping_get(self, url, part, offset):
        with open(part, "ab") as handle:
            handle.write(WEIGHTS[offset:offset + piece])
        if offset + piece < len(WEIGHTS):
            raise requests.ConnectionError("Connection broken: IncompleteRead")
        return True

    monkeypatch.setattr(downloader.Downloader, "_get", dropping_get)
    assert downloader.Downloader(job, None).run() == 0
    assert read_status(job).status == "done"
    assert (plan.target_dir / "model.safetensors").read_bytes() == WEIGHTS


def test_a_retrying_download_says_so_and_shows_no_stale_rate_or_eta(hub_server, monkeypatch):
    """The QA dropped the link mid-download: while the downloader waited and tried again, state.json kept the
    last good rate and ETA, so the CLI and the app showed them frozen as if live. While it retries, the record
    says so (the attempt, the error in short) with no rate or ETA; the first bytes after clear it."""
    import requests

    from core.hub import downloader
    from core.hub.commands import ProgressPrinter

    plan = _plan(include=["model.safetensors"])
    job = _job_in_process(plan)
    piece = 64 * 1024
    seen = []

    def dropping_get(self, url, part, offset):
        with open(part, "ab") as handle:
            handle.write(WEIGHTS[offset:offset + piece])
        self.rate = 2_000_000.0  # a good rate before the drop
        self.write_state("running", force=True)
        if offset < piece:  # the first attempt's link drops, the next ones bring the rest
            raise requests.ConnectionError("Connection broken: IncompleteRead(65536 bytes read)")
        with open(part, "ab") as handle:
            handle.write(WEIGHTS[offset + piece:])
        return True

    monkeypatch.setattr(downloader.Downloader, "_get", dropping_get)
    monkeypatch.setattr(downloader.time, "sleep", lambda seconds: seen.append(read_status(job)))  # the back-off
    assert downloader.main([str(job)]) == 0  # holding the job's lock, as the detached one does: alive
    waiting = seen[0]  # the back-off's first step (it looks for a cancel between steps)
    assert waiting.active and waiting.retrying and waiting.retry_attempt == 2, waiting
    assert "IncompleteRead" in waiting.retry_reason and len(waiting.retry_reason) <= 120
    assert waiting.rate_bps == 0 and waiting.eta_s is None  # not the 2 MB/s of before the drop
    shown = ProgressPrinter(None).line(waiting)
    assert "retrying (attempt 2): Connection broken" in shown and "ETA" not in shown and "/s" not in shown, shown
    done = read_status(job)
    assert done.status == "done" and not done.retrying and done.retry_attempt is None


def test_models_list_of_a_download_still_running_says_so_in_the_language_and_how_to_follow_it(hub_server, capsys):
    """`models list` showed a download still going as "download running; ... resumes it, or delete the folder"
    (there is nothing to resume, and rm refuses a folder a download writes into), and under zh "下载running":
    the raw status. Now it says it is still downloading, how to watch and how to stop it; a stopped one its
    status in words of the language."""
    from core import i18n
    from core.cli import main
    from core.hub.download import cancel_download

    hub_server.hub.stall_at = 128 * 1024  # the download is certainly running while it is listed
    plan = _plan(include=["model.safetensors"])
    job = start_download(plan)
    _wait_until_stalled(job, plan)
    try:
        assert main(["models", "list"]) == 0
        out = capsys.readouterr().out
        assert "still downloading" in out and "--cancel" in out and "resumes it" not in out, out
        assert main(["--lang", "zh", "models", "list"]) == 0
        out = capsys.readouterr().out
        assert "仍在下载中" in out and "running" not in out, out
        assert cancel_download(job)
    finally:
        hub_server.hub.stall_release.set()
    assert wait_for_download(job, 30).status == "cancelled"
    try:
        assert main(["--lang", "zh", "models", "list"]) == 0
        out = capsys.readouterr().out
        assert "下载已停止" in out and "cancelled" not in out, out
    finally:
        i18n.set_language("en")


def test_a_resumed_download_reports_the_speed_of_the_link_not_of_the_bytes_already_there(hub_server):
    """The speed started from 0 bytes while a resumed download starts at the bytes already on disk: its first
    figure counted them as fetched in half a second (30 MB there read "60 MB/s" on a link of 0.6 MB/s), the
    ETA as short, for seconds. The link here is at most 64 KiB per 0.1 s (the fake hub's pause between
    chunks), ~0.66 MB/s; the bound left for a socket's buffered burst on a loaded box is generous."""
    from tests.hubserver import FakeRepo, tiny_config

    weights = b"w" * (32 * 1024 * 1024)
    hub_server.hub.add(FakeRepo("acme/Resumed-Model", files={
        "config.json": json.dumps(tiny_config()).encode(), "model.safetensors": weights}))
    plan = _plan(model="acme/Resumed-Model", include=["model.safetensors"])
    plan.target_dir.mkdir(parents=True)
    (plan.target_dir / "model.safetensors.part").write_bytes(weights[:30 * 1024 * 1024])  # a killed download's
    hub_server.hub.chunk_delay_s = 0.1  # the last 2 MiB take 3 s or more
    job = start_download(plan)
    rates = []
    deadline = time.monotonic() + 120  # a hang guard, not a speed
    status = read_status(job)
    while time.monotonic() < deadline:
        status = read_status(job)
        if status is not None and not status.active:
            break
        if status is not None and status.rate_bps:
            rates.append(status.rate_bps)
        time.sleep(0.02)
    assert status is not None and status.status == "done", status
    assert rates, "no speed was ever reported"
    assert max(rates) < 8e6, rates  # the link gives < 0.7 MB/s; counting the 31 MB on disk gave tens of MB/s


def test_why_a_download_failed_is_written_in_the_language_it_was_started_in(hub_server):
    """The detached downloader never set its language: why a download failed (a full disk, a file that is no
    longer there) was English in state.json, and so in the zh app's download line and dialog, `models list`
    and `models download`. It writes it in the language of the command or app that started it."""
    from core import i18n

    plan = _plan(include=["model.safetensors"])
    hub_server.hub.status = 404  # the file went from the hub between the listing and the download
    i18n.set_language("zh")
    try:
        status = wait_for_download(start_download(plan), 60)
    finally:
        i18n.set_language("en")
    assert status.status == "failed", status
    assert any("\u4e00" <= char <= "\u9fff" for char in status.error), status.error


def test_a_second_start_while_the_first_downloader_is_still_starting_says_it_runs_and_keeps_its_files(
        hub_server, capsys):
    """Two `models download --detach` at the same instant both said "Started" and both launched a downloader: the
    first one's interpreter had not taken the job's lock yet, so the second found none running and rewrote
    job.json (its --include could win). A downloader spawned and still starting counts as running: the second is
    told so, with the files the first fetches, and neither job.json nor the spawned process is replaced."""
    from core.cli import main
    from core.hub.download import start_or_join_download

    first = _plan(include=["model.safetensors"])
    job = job_dir_for(first.hub, first.model_id)
    job.mkdir(parents=True)
    write_json_atomic(job / "job.json", first.to_json())
    write_json_atomic(job / "state.json", {"status": "queued", "updated": time.time()})
    # the first start's downloader, alive and not yet at its lock (a loaded box takes seconds to import)
    stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        spawned = {"pid": stand_in.pid, "started_at": process_start_time(stand_in.pid)}
        write_json_atomic(job / SPAWNED_FILE, spawned)
        job_before = (job / "job.json").read_bytes()
        model = "Qwen/Qwen2.5-Tiny-Instruct"
        assert main(["models", "download", model, "--include", "*.json", "--detach"]) == 2
        err = capsys.readouterr().err
        assert "Started" not in err and f"A download of {model} is running" in err, err
        assert "(model.safetensors)" in err, err  # what the running download fetches
        assert main(["models", "download", model, "--detach"]) == 0
        err = capsys.readouterr().err
        assert "Already under way" in err and "Started" not in err, err
        assert start_or_join_download(_plan(include=["*.json"])) == (job, False)
        assert (job / "job.json").read_bytes() == job_before
        assert json.loads((job / SPAWNED_FILE).read_text()) == spawned
    finally:
        stand_in.kill()
        stand_in.wait()


def test_downloading_a_model_already_downloaded_says_so_and_starts_nothing(hub_server, capsys):
    """Run again on a finished model, `models download` said "Downloading 2 files (…)" and started a downloader
    that fetched nothing. It says the model is already downloaded, and where; exit 0, no downloader."""
    from core.cli import main
    from core.hub.download import download_running

    model = "Qwen/Qwen2.5-Tiny-Instruct"
    assert main(["models", "download", model]) == 0
    capsys.readouterr()
    plan = _plan()
    job = job_dir_for(plan.hub, plan.model_id)
    spawned = (job / SPAWNED_FILE).read_bytes()
    deadline = time.monotonic() + 60  # the finished downloader's process exits (a hang guard, not a speed)
    while download_running(job) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert main(["models", "download", model]) == 0
    err = capsys.readouterr().err
    assert f"Already downloaded: {model} is in {plan.target_dir}" in err and "Downloading" not in err, err
    assert main(["models", "download", model, "--detach", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "done" and out["already_downloaded"] and out["target_dir"] == str(plan.target_dir)
    assert (job / SPAWNED_FILE).read_bytes() == spawned  # no downloader was started
    assert read_status(job).status == "done"


def _catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler of its own for ``signum`` (Linux: SigCgt in /proc/PID/status)."""
    for line in open(f"/proc/{pid}/status", encoding="ascii"):
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def test_a_terminated_foreground_download_says_the_download_goes_on(hub_server, tmp_path):
    """`kill` (SIGTERM) of a foreground `models download`, its output redirected to a file, exited 143 and said
    nothing of the download. The downloader runs in its own session and goes on: the watcher says so, and how
    to watch it again or stop it. (Linux: /proc tells when the watcher's handler is in place.)"""
    from core.hub.download import cancel_download, download_running

    hub_server.hub.stall_at = 128 * 1024
    plan = _plan()
    job = job_dir_for(plan.hub, plan.model_id)
    log = tmp_path / "download.err"
    with open(log, "wb") as err:
        watcher = subprocess.Popen([sys.executable, "-m", "core", "models", "download", plan.model_id],
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                   env={**os.environ, "LC_ALL": "C.UTF-8", "LANGUAGE": ""})
    try:
        _wait_until_stalled(job, plan)
        deadline = time.monotonic() + 60  # the watcher follows the download: its SIGTERM handler is in place
        while time.monotonic() < deadline and not _catches(watcher.pid, signal.SIGTERM):
            time.sleep(0.05)
        assert "Downloading 4 files" in log.read_text(), log.read_text()
        watcher.send_signal(signal.SIGTERM)
        assert watcher.wait(timeout=60) == 128 + signal.SIGTERM
        said = log.read_text()
        assert "SIGTERM: stopped watching; the download goes on in the background" in said, said
        assert f"tunedeck models download {plan.model_id} --cancel" in said, said
        assert download_running(job) and read_status(job).active  # the downloader did go on
    finally:
        watcher.kill()
        watcher.wait()
        cancel_download(job)
        hub_server.hub.stall_release.set()
        wait_for_download(job, 30)


def _holds_open(pid: int, path) -> bool:
    """Whether process ``pid`` has ``path`` open (Linux: /proc/PID/fd)."""
    try:
        return any(os.path.realpath(f"/proc/{pid}/fd/{fd}") == str(path.resolve())
                   for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


def test_a_start_while_the_last_downloader_is_exiting_starts_a_new_one_that_waits_for_the_lock(hub_server, capsys):
    """Started again right after a download ended (here: cancelled), while its downloader had written its end and
    not yet let go of the lock, `models download` read "Already under way", followed the ended job and said it was
    cancelled: nothing started. The ended job runs no more: a new downloader starts and waits for the lock.
    (The test holds the lock as the exiting downloader does; Linux: /proc tells when the new one reached it.)"""
    import fcntl

    from core.cli import main
    from core.hub.download import cancel_download, download_running

    hub_server.hub.stall_at = 128 * 1024
    plan = _plan()
    job = start_download(plan)
    _wait_until_stalled(job, plan)
    assert cancel_download(job)
    hub_server.hub.stall_release.set()
    assert wait_for_download(job, 60).status == "cancelled"
    deadline = time.monotonic() + 60  # the cancelled downloader's process lets go of the lock (a hang guard)
    while downloader_alive(job) and time.monotonic() < deadline:
        time.sleep(0.05)
    hub_server.hub.stall_at = None
    with open(job / "lock", "a+") as exiting:  # the downloader that wrote "cancelled", not yet exited
        fcntl.flock(exiting, fcntl.LOCK_EX)
        assert downloader_alive(job) and not download_running(job)
        assert not cancel_download(job)  # nothing to cancel: that job has ended
        assert main(["models", "download", plan.model_id, "--detach"]) == 0
        err = capsys.readouterr().err
        assert "Started" in err and "Already under way" not in err, err
        spawned = json.loads((job / SPAWNED_FILE).read_text())["pid"]
        deadline = time.monotonic() + 60  # the new downloader's interpreter reaches the lock (a hang guard)
        while not _holds_open(spawned, job / "lock") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert read_status(job).status == "queued" and download_running(job)
    status = wait_for_download(job, 60)
    assert status.status == "done", status
    assert (plan.target_dir / "model.safetensors").read_bytes() == WEIGHTS


def test_models_list_says_a_finished_download_whose_folder_was_deleted_by_hand_is_deleted(hub_server, capsys):
    """`rm -rf` of a downloaded model's folder (not `models rm`, which removes the record too): `models list`
    kept saying "done" of it under Downloads. It says the folder was deleted, in the language; --json tells
    a script by `target_exists`; downloading it again fetches it afresh."""
    import shutil

    from core.cli import main
    from core.i18n import set_language

    plan = _plan()
    assert wait_for_download(start_download(plan), 60).status == "done"
    assert main(["models", "list", "--json"]) == 0
    [record] = json.loads(capsys.readouterr().out)["downloads"]
    assert record["status"] == "done" and record["target_exists"] is True
    shutil.rmtree(plan.target_dir)
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    [row] = [line for line in out.splitlines() if line.startswith("modelscope") and plan.model_id in line]
    assert " deleted " in row and " done " not in row, out
    assert main(["models", "list", "--json"]) == 0
    [record] = json.loads(capsys.readouterr().out)["downloads"]
    assert record["status"] == "done" and record["target_exists"] is False
    try:
        assert main(["--lang", "zh", "models", "list"]) == 0
        assert "已删除" in capsys.readouterr().out
    finally:
        set_language("en")
    assert main(["models", "download", plan.model_id]) == 0
    assert "Done: Qwen/Qwen2.5-Tiny-Instruct" in capsys.readouterr().err
    assert (plan.target_dir / "model.safetensors").read_bytes() == WEIGHTS


def test_a_file_whose_checksum_is_being_checked_is_said_so_not_taken_for_a_stall(hub_server, monkeypatch):
    """A shard of gigabytes is hashed for seconds after its last byte, no state written meanwhile: a watcher
    showed the speed of before, and (since it says a stall after 5 s) would have called it a stalled link. The
    downloader marks the check in state.json; `models download` says "checking FILE (sha256)", no stall."""
    import io

    from core.hub import downloader
    from core.hub.commands import ProgressPrinter

    plan = _plan(include=["model.safetensors"])
    job = _job_in_process(plan)
    seen = []
    real_sha256 = downloader._sha256

    def observed(path, *rest):  # the real hash, the status a watcher reads while it runs noted
        seen.append(read_status(job))
        return real_sha256(path, *rest)

    monkeypatch.setattr(downloader, "_sha256", observed)
    with open(job / "lock", "a+") as lock:  # held as downloader.main holds it: the job reads as running
        assert downloader._take_lock(lock)
        assert downloader.Downloader(job, None).run() == 0
    [during] = seen
    assert during.verifying and during.current_file == "model.safetensors" and during.stalled_s() is None
    assert not read_status(job).verifying
    now = [0.0]
    stream = io.StringIO()
    printer = ProgressPrinter(stream, clock=lambda: now[0])
    for _ in range(20):  # twenty seconds of checking: one line, no stall
        now[0] += 1.0
        printer.show(during)
    [said] = stream.getvalue().splitlines()
    assert "checking model.safetensors (sha256)" in said and "no data" not in said and "/s" not in said, said


def test_a_cancel_while_the_hub_holds_the_transfer_stops_it_without_waiting_for_the_read_timeout(hub_server,
                                                                                                monkeypatch):
    """c (or --cancel) while the hub held the transfer was seen only once the read timed out (15 s) and was
    counted as a dropped link, the app and the CLI saying "running" meanwhile. The downloader cuts the
    connection when the cancel comes: cancelled, no retry on the way, the bytes before the stall kept.

    The downloader runs here, its read timeout longer than the hub's hold (a minute): the read ends only when
    the cut ends it. Without the cut, the cancel was still seen, when the read timed out (the 15 s of a real
    downloader) or the hub let go (more bytes written): the stall passing is what the part's size tells."""

    from core.hub import downloader
    from core.hub.download import cancel_download

    monkeypatch.setattr(downloader, "READ_TIMEOUT_S", 600.0)
    hub_server.hub.stall_at = 128 * 1024  # held until the test ends (a ceiling of a minute): never released here
    plan = _plan(include=["model.safetensors"])
    job = _job_in_process(plan)
    worker, ended = _downloader_in_thread(job)
    try:
        _wait_until_stalled(job, plan)
        assert cancel_download(job)
        status = wait_for_download(job, 120)  # past the hub's minute: a read the cut did not end has ended
        assert status.status == "cancelled", status
        worker.join(60)
        assert ended == {"code": 3}
        events = [json.loads(line) for line in (job / "events.jsonl").read_text().splitlines()]
        assert [e["event"] for e in events if e["event"] in ("retry", "cancelled")] == ["cancelled"], events
        assert not hub_server.hub.stall_release.is_set()
        assert 0 < _partial_size(plan) <= 128 * 1024  # no byte of after the hub's hold
    finally:
        hub_server.hub.stall_release.set()
        worker.join(60)


def test_a_watched_download_whose_downloader_is_killed_says_interrupted_and_how_to_resume(hub_server, capsys,
                                                                                           monkeypatch):
    """The downloader killed (OOM, a reboot) while `models download` watched it: "Download of X failed:
    interrupted", the status word in English under zh, and no word of the way on. It says where it stopped
    and that the same command resumes it (exit 3); under zh in Chinese."""
    from core.cli import main
    from core.hub import commands
    from core.i18n import set_language

    hub_server.hub.stall_at = 128 * 1024
    plan = _plan()
    job = job_dir_for(plan.hub, plan.model_id)
    real_show = commands.ProgressPrinter.show

    def show_then_kill(self, status):  # the watcher follows the download: its downloader is killed now
        if status.pid and _partial_size(plan) >= 64 * 1024 and downloader_alive(job):
            os.kill(status.pid, signal.SIGKILL)
        real_show(self, status)

    monkeypatch.setattr(commands.ProgressPrinter, "show", show_then_kill)
    try:
        assert main(["--lang", "zh", "models", "download", plan.model_id]) == 3
    finally:
        set_language("en")
        hub_server.hub.stall_release.set()
    err = capsys.readouterr().err
    assert "下载在" in err and "中断" in err and f"tunedeck models download {plan.model_id}" in err, err
    assert "interrupted" not in err and read_status(job).status == "interrupted"


def test_a_download_still_queued_is_not_said_stalled(hub_server):
    """`models download` in a log said "no data for 6 s (the downloader tries again after 15 s …)" of a download
    still queued: its downloader's interpreter starting on a loaded box, or waiting for the lock the downloader
    of the job's last run has not let go yet (up to ``LOCK_WAIT_S``). No transfer is there to be held; the app's
    line (``stalled_s``) says a stall only while the download runs, and so does the CLI now. (A clock the test
    moves; no process runs: the record is as ``start_download`` writes it before its downloader takes over.)"""
    import io

    from core.hub.commands import ProgressPrinter

    plan = _plan(include=["model.safetensors"])
    job = _job_in_process(plan)
    write_json_atomic(job / "state.json", {"status": "queued", "updated": time.time(), "bytes_done": 0,
                                           "bytes_total": plan.total_bytes, "files_total": len(plan.files)})
    queued = read_status(job)
    assert queued.status == "queued" and queued.stalled_s(time.time() + 60) is None
    now = [0.0]
    stream = io.StringIO()
    printer = ProgressPrinter(stream, clock=lambda: now[0])
    for _ in range(40):  # forty seconds queued
        now[0] += 1.0
        printer.show(queued)
    said = stream.getvalue()
    assert said and "no data" not in said, said


def test_a_cancel_while_the_hub_holds_its_answer_stops_before_the_headers_come(hub_server, monkeypatch):
    """A hub that holds the request before it answers (no headers yet: a busy mirror, a CDN fetching the file
    first): c (or --cancel) waited for the read timeout (15 s), "running" meanwhile, as the body's cut
    (``_cancel_cuts``) watches only an answer that has come. The wait for the headers now looks for the cancel:
    cancelled while the hub still holds the answer, no retry, not a byte written.

    The downloader runs here, its read timeout longer than the hub's hold (a minute). Without the fix the cancel
    was seen only once the hub let go (its minute passed): it reads cancelled here while the hub still holds it."""

    from core.hub import downloader
    from core.hub.download import cancel_download

    monkeypatch.setattr(downloader, "READ_TIMEOUT_S", 600.0)
    plan = _plan(include=["model.safetensors"])
    job = _job_in_process(plan)
    hub_server.hub.hold = threading.Event()  # every answer from now on waits (a ceiling of a minute)
    def asked() -> bool:  # the downloader's GET of the file reached the hub, which holds it
        with hub_server.hub.lock:
            return hub_server.hub.held == 1

    worker, ended = _downloader_in_thread(job)
    try:
        deadline = time.monotonic() + 60  # a hang guard, not a speed
        while not asked() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert asked(), read_status(job)
        assert cancel_download(job)
        status = wait_for_download(job, 120)  # past the hub's minute: a wait the cancel did not end has ended
        assert status.status == "cancelled", status
        # the hub holds the request still: the cancel did not wait for its answer (without the fix it was seen
        # only once the hub's minute had passed and it answered; the body's cut then stopped it, maybe no byte in)
        assert hub_server.hub.held == 1
        worker.join(60)
        assert ended == {"code": 3}
        events = [json.loads(line) for line in (job / "events.jsonl").read_text().splitlines()]
        assert [e["event"] for e in events if e["event"] in ("retry", "cancelled")] == ["cancelled"], events
        assert _partial_size(plan) == 0  # no byte: the hub never answered before the cancel ended the wait
    finally:
        hub_server.hub.hold.set()
        worker.join(60)


def test_a_queued_download_still_starting_is_cancelled_and_its_folder_not_deleted(hub_server, capsys):
    """"Is a download running" was written twice: the delete check asked whether a downloader held the lock,
    ``cancel_download`` too, so a download queued and still starting (its downloader spawned, its interpreter not
    yet at the lock: seconds on a loaded box) could be deleted under it (x, ``models rm``), and c / --cancel said
    "No download of X is running" while it then started. Both now ask ``download_running``: the delete is
    refused with the way to cancel, and the cancel is sent (the downloader finds it before its first byte)."""
    from core.cli import main
    from core.hub.download import cancel_download
    from core.hub.local import DeleteRefusedError, delete_blocker, list_local_models

    hub_server.hub.stall_at = 128 * 1024
    plan = _plan(include=["model.safetensors", "config.json"])
    job = start_download(plan)
    _wait_until_stalled(job, plan)
    assert cancel_download(job)
    hub_server.hub.stall_release.set()
    assert wait_for_download(job, 30).status == "cancelled"  # a partial model on disk, its record stopped
    deadline = time.monotonic() + 60  # the cancelled downloader lets go of the lock (a hang guard, not a speed)
    while downloader_alive(job) and time.monotonic() < deadline:
        time.sleep(0.05)
    # started again: queued, its downloader alive and not yet at the lock
    write_json_atomic(job / "state.json", {"status": "queued", "updated": time.time()})
    stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        write_json_atomic(job / SPAWNED_FILE, {"pid": stand_in.pid, "started_at": process_start_time(stand_in.pid)})
        assert read_status(job).status == "queued" and not downloader_alive(job)
        [model] = list_local_models()
        blocker = delete_blocker(model)
        assert isinstance(blocker, DeleteRefusedError) and "--cancel" in str(blocker), blocker
        assert main(["models", "rm", plan.model_id, "--yes"]) == 2
        assert "--cancel" in capsys.readouterr().err and plan.target_dir.exists() and job.exists()
        assert main(["models", "download", plan.model_id, "--cancel"]) == 0
        assert "Asked the downloader" in capsys.readouterr().err
        assert (job / "cancel").exists()
    finally:
        stand_in.kill()
        stand_in.wait()


@pytest.mark.parametrize(("file", "edit"), [
    ("state.json", {"status": "failed", "bytes_done": "12x", "updated": 1.0}),
    ("state.json", {"status": "cancelled", "updated": "yesterday"}),
    ("job.json", None),  # a file's size that is no number
])
def test_a_record_with_a_malformed_number_is_listed_unreadable_not_a_crash(hub_server, capsys, file, edit):
    """A download record edited by hand (a size, a byte count that is no number): read_status raised ValueError,
    and ``models list`` (and the app's download line) crashed on it, every other download unlisted with it. That
    one reads "unreadable", its error naming the file, the key and the way out; the others are listed as ever."""
    from core.cli import main
    from core.hub.download import list_downloads

    plan = _plan()
    assert wait_for_download(start_download(plan), 60).status == "done"
    broken = job_dir_for("hf", "acme/broken-model")
    broken.mkdir(parents=True)
    job = {"hub": "hf", "model_id": "acme/broken-model", "target_dir": str(broken / "nowhere"),
           "files": [{"path": "model.safetensors", "size": "ten" if edit is None else 10}]}
    write_json_atomic(broken / "job.json", job)
    write_json_atomic(broken / "state.json", edit or {"status": "failed", "updated": 1.0})
    status = read_status(broken)
    assert status.status == "unreadable" and not status.active
    assert str(broken / file) in status.error and "tunedeck models download acme/broken-model --hub hf" in status.error
    assert sorted(d.status for d in list_downloads()) == ["done", "unreadable"]
    capsys.readouterr()
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert "unreadable" in out and str(broken / file) in out, out
    assert main(["models", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["downloads"]
    assert sorted(d["status"] for d in listed) == ["done", "unreadable"]


def test_models_rm_removes_the_record_of_a_download_whose_folder_is_gone(hub_server, capsys):
    """A finished download whose folder was deleted by hand stayed in ``models list`` as "deleted" for good:
    ``models rm ID`` said "no model on disk" (exit 2), and no command removed the record. It now removes the
    record (nothing on disk to delete, no question asked), says so, and leaves other downloads' records alone."""
    import shutil

    from core.cli import main
    from core.hub.download import list_downloads

    plan = _plan()
    assert wait_for_download(start_download(plan), 60).status == "done"
    other = _plan("hf")
    assert wait_for_download(start_download(other), 60).status == "done"
    shutil.rmtree(plan.target_dir)
    capsys.readouterr()
    assert main(["models", "list"]) == 0
    assert "deleted" in capsys.readouterr().out
    assert main(["models", "rm", plan.model_id, "--hub", "modelscope"]) == 0
    err = capsys.readouterr().err
    assert "removed its download record" in err and str(plan.target_dir) in err, err
    assert [(d.hub, d.status) for d in list_downloads()] == [("hf", "done")]  # the hf one, whole, untouched
    assert other.target_dir.exists()
    # nothing left to remove: said as before (exit 2)
    assert main(["models", "rm", plan.model_id, "--hub", "modelscope"]) == 2
    assert "no model" in capsys.readouterr().err


def test_a_stalled_transfer_says_the_bytes_it_has_written_not_those_of_a_quarter_second_before(hub_server,
                                                                                                monkeypatch):
    """state.json is written at most every quarter second: the chunks that came within that time of its last
    write, just before the hub held the transfer, were not in it, and the app and ``models list`` said the older
    figure for the whole stall (369 B of a file with 128 kB on disk). Once no chunk comes for a moment the
    bytes written are said. The downloader runs here, its state writes spaced far apart (a minute) so that
    only the said-when-still write can tell the stall's figure."""

    from core.hub import downloader

    monkeypatch.setattr(downloader, "STATE_INTERVAL_S", 600.0)
    monkeypatch.setattr(downloader, "READ_TIMEOUT_S", 600.0)  # no retry's write during the hold either
    hub_server.hub.stall_at = 128 * 1024  # held until the test ends (a ceiling of a minute)
    plan = _plan(include=["model.safetensors"])
    job = _job_in_process(plan)
    worker = threading.Thread(target=lambda: downloader.Downloader(job, None).run(), daemon=True)
    worker.start()
    try:
        deadline = time.monotonic() + 60  # a hang guard, not a speed
        while _partial_size(plan) < 128 * 1024 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _partial_size(plan) == 128 * 1024  # every byte before the hub's hold is on disk
        while read_status(job).bytes_done != 128 * 1024 and time.monotonic() < deadline:
            time.sleep(0.05)
        status = read_status(job)
        assert status.bytes_done == 128 * 1024 and status.current_file == "model.safetensors", status
        assert not hub_server.hub.stall_release.is_set()
    finally:
        hub_server.hub.stall_release.set()
        worker.join(60)
    assert read_status(job).status == "done"


def test_a_cancel_while_a_file_s_checksum_is_checked_stops_it_keeping_the_file(hub_server, monkeypatch):
    """Hashing a shard of gigabytes on a slow disk takes a minute after its last byte: c (or --cancel) asked
    meanwhile waited for the hash to end ("checking ... (sha256)" all along) and the download then went on. The
    hash looks for the cancel as it reads: cancelled, the whole part kept for the resume (checked again then)."""
    from core.hub import downloader
    from core.hub.download import cancel_download

    plan = _plan(include=["model.safetensors"])
    job = _job_in_process(plan)
    real_sha256 = downloader._sha256

    def cancelled_as_it_starts(path, *rest):  # the real hash; the cancel asked once the check has begun
        assert read_status(job).verifying and cancel_download(job)
        return real_sha256(path, *rest)

    monkeypatch.setattr(downloader, "_sha256", cancelled_as_it_starts)
    with open(job / "lock", "a+") as lock:  # held as downloader.main holds it: the job reads as running
        assert downloader._take_lock(lock)
        assert downloader.Downloader(job, None).run() == 3
    status = read_status(job)
    assert status.status == "cancelled" and not status.verifying, status
    assert _partial_size(plan) == len(WEIGHTS) and not (plan.target_dir / "model.safetensors").exists()


def unreadable_download_record(hub: str) -> None:
    """The record of a failed download of ``acme/broken-model`` from ``hub`` whose state.json holds a byte count
    that is no number (edited by hand): it reads "unreadable"."""
    broken = job_dir_for(hub, "acme/broken-model")
    broken.mkdir(parents=True)
    write_json_atomic(broken / "job.json", {"hub": hub, "model_id": "acme/broken-model",
                                            "target_dir": str(broken / "nowhere"),
                                            "files": [{"path": "model.safetensors", "size": 10}]})
    write_json_atomic(broken / "state.json", {"status": "failed", "bytes_done": "12x", "updated": 1.0})


def test_the_unreadable_state_is_said_whole_in_the_models_list_column_under_zh(hub_server, capsys):
    """``models list`` pads a download's state to its column (11 cells) and cuts what is longer: under zh the
    "unreadable" state read "记录无法读…". Said whole now, its reason on the line below."""
    from core import i18n
    from core.cli import main

    unreadable_download_record("hf")
    capsys.readouterr()
    try:
        assert main(["--lang", "zh", "models", "list"]) == 0
        label = i18n.t("hub.download.state.unreadable")
    finally:
        i18n.set_language("en")
    out = capsys.readouterr().out
    [line] = [line for line in out.splitlines() if "acme/broken-model" in line and "json" not in line]
    assert label in line and "…" not in line, out


def test_a_failed_state_write_in_a_stall_leaves_the_cancel_watched(hub_server, monkeypatch):
    """The body's watcher (``_cancel_cuts``) also writes the bytes of a stalled transfer: a write of state.json
    that failed there (a full disk) ended the watcher, and a cancel then waited for the hub to send again (the read
    timeout, 15 s), "running" meanwhile, as before the watcher existed. The write's failure is left to the transfer
    (its next write says it); the cancel is still seen during the stall. The downloader runs here, its state.json
    write refused in the watcher only; the fake hub holds the body at 128 KiB (a ceiling of a minute)."""
    import errno

    from core.hub import downloader
    from core.hub.download import cancel_download

    monkeypatch.setattr(downloader, "STATE_INTERVAL_S", 600.0)  # the stall's bytes are the watcher's to write
    monkeypatch.setattr(downloader, "READ_TIMEOUT_S", 600.0)
    hub_server.hub.stall_at = 128 * 1024
    plan = _plan(include=["model.safetensors"])
    job = _job_in_process(plan)
    refused = threading.Event()
    real_write = downloader.write_json_atomic

    def full_disk_for_the_watcher(*args, **kwargs):
        if threading.current_thread().name == "cancel-watch":
            refused.set()
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(*args, **kwargs)

    monkeypatch.setattr(downloader, "write_json_atomic", full_disk_for_the_watcher)
    worker, ended = _downloader_in_thread(job)
    try:
        assert refused.wait(60)  # the watcher's write of the stall's bytes failed (a hang guard, not a speed)
        assert cancel_download(job)
        status = wait_for_download(job, 120)  # past the hub's minute: a cancel not cut in the stall has ended too
        assert status.status == "cancelled", status
        worker.join(60)
        assert ended == {"code": 3}
        assert _partial_size(plan) == 128 * 1024  # cut in the stall: without the watcher, bytes after it came first
    finally:
        hub_server.hub.stall_release.set()
        worker.join(60)
