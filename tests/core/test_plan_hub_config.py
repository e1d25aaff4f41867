"""``plan`` / ``estimate`` of a hub model that is not downloaded: its config.json read from the hub (the local fake
hub, the real protocol), kept under tunedeck's data root, planned from there with the hub out of reach; offline with
nothing kept, one line that says what to do. Hardware: ``--hardware H200`` (typed, no GPU looked at)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.hubserver import FakeHubServer, FakeRepo, closed_port_url, standard_hub

ROOT = Path(__file__).resolve().parents[2]
MODEL = "acme/Unknown-7B"
# a shape no bundled config has: hidden 3072, 30 layers
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 3072,
          "intermediate_size": 8192, "num_hidden_layers": 30, "num_attention_heads": 24, "num_key_value_heads": 8,
          "vocab_size": 64000, "max_position_embeddings": 8192, "tie_word_embeddings": False,
          "torch_dtype": "bfloat16"}
FILES = {"config.json": json.dumps(CONFIG).encode(), "README.md": b"# Unknown\n",
         "model-00001-of-00002.safetensors": b"A" * 4096, "model-00002-of-00002.safetensors": b"B" * 8192}
DOWNLOAD = sum(len(data) for data in FILES.values())  # what train fetches: one weight format


def hub_with_model():
    hub = standard_hub()
    hub.add(FakeRepo(MODEL, files={**FILES, "pytorch_model.bin": b"C" * 100000}))  # not fetched beside safetensors
    return hub


def tunedeck(tmp_path, endpoint, *args):
    env = {**os.environ, "TUNEDECK_HOME": str(tmp_path / "home"), "MODELSCOPE_ENDPOINT": endpoint,
           "HF_ENDPOINT": endpoint, "MODELSCOPE_CACHE": str(tmp_path / "ms"),
           "MODELSCOPE_HOME": str(tmp_path / "ms-home"), "HF_HOME": str(tmp_path / "hf")}
    for name in ("TUNEDECK_FAKE_GPUS", "HF_HUB_CACHE", "MODELSCOPE_API_TOKEN", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "core", *args], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=120)


def kept(tmp_path) -> Path:
    return tmp_path / "home" / "cache" / "hub-configs" / "modelscope" / "acme" / "Unknown-7B" / "config.json"


def test_plan_of_a_model_only_on_the_hub_then_offline_from_the_kept_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))  # the same shape, named as a file: the reference
    reference = tunedeck(tmp_path, closed_port_url(), "plan", "--model", str(tmp_path / "config.json"),
                         "--hardware", "H200", "--json")
    assert reference.returncode == 0, reference.stderr
    expected = json.loads(reference.stdout)["recommendation"]
    with FakeHubServer(hub_with_model()) as server:
        proc = tunedeck(tmp_path, server.url, "plan", "--model", MODEL, "--hardware", "H200", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert json.loads(kept(tmp_path).read_text()) == CONFIG  # the server's config.json, kept
    read = data["model_source"].pop("config_read")  # when it was read from the hub (local time, ISO 8601)
    assert read.startswith(time.strftime("%Y-%m-%dT", time.localtime(kept(tmp_path).stat().st_mtime)))
    assert data["model_source"] == {"config": str(kept(tmp_path)), "hub": "modelscope", "weights_on_box": False,
                                    "download_bytes": DOWNLOAD}
    # planned from the server's shape: the same plan as its config.json named as a file
    assert data["recommendation"]["peak_gib"] == expected["peak_gib"]
    assert data["recommendation"]["plan"] == expected["plan"]

    offline = tunedeck(tmp_path, closed_port_url(), "plan", "--model", MODEL, "--hardware", "H200")
    assert offline.returncode == 0, offline.stderr
    assert "Recommended: " in offline.stdout
    from core.hub.download import human_bytes

    assert (f"{MODEL}: sized from its config.json from ModelScope; its weights are not on this box yet, "
            f"tunedeck train downloads them at its start ({human_bytes(DOWNLOAD)})") in offline.stdout

    assert "was read on" not in offline.stdout  # read today: nothing to say of its age

    estimate = tunedeck(tmp_path, closed_port_url(), "estimate", "--model", MODEL, "--hardware", "H200", "--json")
    assert estimate.returncode == 0, estimate.stderr
    assert json.loads(estimate.stdout)["model_source"]["weights_on_box"] is False
    assert "its weights are not on this box yet" in estimate.stderr


def test_a_plan_from_a_config_kept_over_a_week_says_when_it_was_read(tmp_path):
    """A kept hub config.json is used for ever (plans work offline), and the hub's model may change: one read
    over a week ago says the date and how to read it again. Its file's time is set back 8 days."""
    with FakeHubServer(hub_with_model()) as server:
        assert tunedeck(tmp_path, server.url, "plan", "--model", MODEL, "--hardware", "H200").returncode == 0
    old = time.time() - 8 * 24 * 3600
    os.utime(kept(tmp_path), (old, old))
    day = time.strftime("%Y-%m-%d", time.localtime(old))
    for command in ("plan", "estimate"):
        proc = tunedeck(tmp_path, closed_port_url(), command, "--model", MODEL, "--hardware", "H200")
        assert proc.returncode == 0, proc.stderr
        assert (f"its config.json was read on {day} and may have changed there since: "
                f"tunedeck models info {MODEL} reads it again") in " ".join((proc.stdout + proc.stderr).split())


def test_models_info_keeps_the_config_for_plan(tmp_path):
    with FakeHubServer(hub_with_model()) as server:
        info = tunedeck(tmp_path, server.url, "models", "info", MODEL, "--hub", "hf")
    assert info.returncode == 0, info.stderr
    path = tmp_path / "home" / "cache" / "hub-configs" / "hf" / "acme" / "Unknown-7B" / "config.json"
    assert json.loads(path.read_text()) == CONFIG
    proc = tunedeck(tmp_path, closed_port_url(), "plan", "--model", MODEL, "--hardware", "H200", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["model_source"]["hub"] == "hf"


@pytest.mark.parametrize("command", ["plan", "estimate"])
def test_offline_with_nothing_kept_is_one_line_of_advice(tmp_path, command):
    proc = tunedeck(tmp_path, closed_port_url(), command, "--model", MODEL, "--hardware", "H200")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    line = lines[0]
    assert f"'{MODEL}'" in line and "not reachable" in line
    assert f"tunedeck models download {MODEL}" in line and f"tunedeck models info {MODEL}" in line
    assert "--model path/to/config.json" in line
    assert not (tmp_path / "home" / "cache" / "hub-configs").exists()


def test_a_model_no_hub_has_is_said_so(tmp_path):
    with FakeHubServer(standard_hub()) as server:
        proc = tunedeck(tmp_path, server.url, "plan", "--model", "acme/No-Such-Model", "--hardware", "H200")
    assert proc.returncode == 2
    assert "no hub has it" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("bad", ["../x", "a/b/c", "/etc/passwd", "a/..", "../../home/x"])
def test_a_bad_id_never_writes_outside_the_cache(tmp_path, monkeypatch, bad):
    from core.hub.config_cache import cache_root, cached_config_path, fetch_hub_config, store_hub_config

    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))
    assert cached_config_path("modelscope", bad) is None
    assert store_hub_config("modelscope", bad, CONFIG) is None
    with pytest.raises(ValueError):
        fetch_hub_config(bad)
    assert not cache_root().exists()
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert written == [], written


@pytest.mark.parametrize("bad", ["../x", "a/b/c"])
def test_plan_of_a_bad_id_asks_no_hub_and_writes_nothing(tmp_path, bad):
    with FakeHubServer(hub_with_model()) as server:
        proc = tunedeck(tmp_path, server.url, "plan", "--model", bad, "--hardware", "H200")
        assert server.hub.requests == []
    assert proc.returncode == 2 and "Bundled: " in proc.stderr  # the local advice: no hub asked
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]



def test_plan_on_this_box_weighs_the_download_against_the_hub_cache_disk(tmp_path):
    """``tunedeck plan`` on this box weighed the data root's free disk only (68 GB on the recording's H200 box),
    while the download fills MODELSCOPE_CACHE, here on another disk with 5 kB free: the plan read as fine and the
    run's download failed. The plan now says the download does not fit there, names the disk and
    MODELSCOPE_CACHE, in its reasons, warnings and --json. Hardware: the fake h200x1 recording, given a ModelScope
    cache disk (the real sampler's ``cache_disks``)."""
    recording = json.loads((ROOT / "tests" / "fixtures" / "gpus" / "h200x1.json").read_text())
    recording["host"]["cache_disks"] = [{"hubs": ["modelscope"], "path": "/mnt/ms", "total_bytes": 10**12,
                                         "free_bytes": 5000}]
    fake = tmp_path / "box.json"
    fake.write_text(json.dumps(recording))
    with FakeHubServer(hub_with_model()) as server:  # keeps the model's config.json and its download's size
        assert tunedeck(tmp_path, server.url, "models", "info", MODEL).returncode == 0
    env = {**os.environ, "TUNEDECK_HOME": str(tmp_path / "home"), "TUNEDECK_FAKE_GPUS": str(fake),
           "MODELSCOPE_ENDPOINT": closed_port_url(), "HF_ENDPOINT": closed_port_url(),
           "MODELSCOPE_CACHE": str(tmp_path / "ms"), "HF_HOME": str(tmp_path / "hf")}
    env.pop("HF_HUB_CACHE", None)
    run = [sys.executable, "-m", "core", "plan", "--model", MODEL]
    text = subprocess.run(run, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert text.returncode == 0, text.stderr
    out = " ".join(text.stdout.split())
    from core.hub.download import human_bytes

    assert (f"{MODEL}'s download ({human_bytes(DOWNLOAD)}) goes to the ModelScope cache at /mnt/ms, another disk "
            f"than the data root's (the checkpoints'): 5.0 kB free there (MODELSCOPE_CACHE moves it)") in out, out
    assert (f"{MODEL}'s download ({human_bytes(DOWNLOAD)}, plus 67.1 MB spare) does not fit the ModelScope cache's "
            "disk: 5.0 kB free at /mnt/ms") in out, out
    data = json.loads(subprocess.run([*run, "--json"], capture_output=True, text=True, env=env, cwd=ROOT,
                                     timeout=120).stdout)
    assert data["hardware"]["cache_disks"] == [{"hubs": ["modelscope"], "path": "/mnt/ms", "free_gib": 0.0}]
    assert [w["rule"] for w in data["recommendation"]["warnings"]].count("download_disk") == 1
    assert any(r["field"] == "download" and "/mnt/ms" in r["message"] for r in data["reasons"])
