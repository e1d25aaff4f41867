"""``TUNEDECK_MEMORY_PROFILE``: the replay of a CUDA allocator trace that names what is live at the peak.
The trace is the shape ``torch.cuda.memory._snapshot()`` gives (no GPU needed to check the arithmetic);
on the GPU it ran through bench/engine_longctx.py --memory-profile (bench/results/engine-longctx-*)."""

from __future__ import annotations

from core.train.profiling import parse_memory_profile_env, peak_breakdown

MIB = 2 ** 20


def _frames(*sites: str) -> list[dict]:
    torch_frame = {"filename": "/usr/lib/python3/site-packages/torch/nn/functional.py", "line": 1, "name": "linear"}
    return [torch_frame] + [{"filename": f"/x/{s.split(':')[0]}", "line": int(s.split(':')[1]), "name": "f"}
                            for s in sites]


def test_peak_is_the_highest_live_total_and_lists_what_was_live_then():
    trace = [
        {"action": "alloc", "addr": 1, "size": 100 * MIB, "frames": _frames("train/loss.py:10", "train/worker.py:5")},
        {"action": "alloc", "addr": 2, "size": 300 * MIB, "frames": _frames("models/attn.py:7")},
        {"action": "free_requested", "addr": 2, "size": 300 * MIB},
        {"action": "free_completed", "addr": 2, "size": 300 * MIB},
        {"action": "alloc", "addr": 3, "size": 50 * MIB, "frames": _frames("train/loss.py:10", "train/worker.py:5")},
        {"action": "alloc", "addr": 4, "size": 50 * MIB, "frames": _frames("train/loss.py:10", "train/worker.py:5")},
    ]
    text = peak_breakdown(trace, before_bytes=1024 * MIB)
    # peak = 1 GiB before + 100 + 300 MiB live after event 2 (later, 100 + 50 + 50 = 200 MiB is less)
    assert text.startswith("peak of the steps 1.39 GiB = 1.00 GiB allocated before them")
    assert "+ 0.39 GiB live at event 2 of 6" in text
    by_site = text.split("## live at the peak, by allocation site")[1].split("##")[0]
    assert "attn.py:7" in by_site and "loss.py:10" in by_site
    assert by_site.index("attn.py:7") < by_site.index("loss.py:10")  # the larger first
    assert "torch/nn" not in by_site  # torch's own frames are skipped: the caller is named


def test_a_free_without_its_alloc_in_the_trace_does_not_go_below_the_start():
    trace = [{"action": "free_completed", "addr": 9, "size": 10 * MIB},
             {"action": "alloc", "addr": 1, "size": 10 * MIB, "frames": []}]
    text = peak_breakdown(trace, before_bytes=0)
    assert "0.01 GiB live at event 2 of 2" in text and "(no stack) blocks of 10.0 MiB" in text


def test_env_value_names_the_steps():
    assert parse_memory_profile_env("2") == (2, 1)
    assert parse_memory_profile_env("2:3") == (2, 3)
    assert parse_memory_profile_env("0") is None
    assert parse_memory_profile_env("x") is None
    assert parse_memory_profile_env(None) is None


def test_a_block_stops_counting_when_its_free_is_requested_as_torch_counts_allocated():
    """Freed while another stream still used it: reusable later (free_completed), but no longer allocated."""
    trace = [{"action": "alloc", "addr": 1, "size": 100 * MIB, "frames": []},
             {"action": "free_requested", "addr": 1, "size": 100 * MIB},
             {"action": "alloc", "addr": 2, "size": 100 * MIB, "frames": []},
             {"action": "free_completed", "addr": 1, "size": 100 * MIB}]
    assert "+ 0.10 GiB live at event 1 of 4" in peak_breakdown(trace, before_bytes=0)


def test_reserved_breakdown_says_which_stream_holds_the_free_memory():
    """torch's snapshot segments (the fields torch.cuda.memory._snapshot() gives): reserved, allocated and free
    blocks summed by stream, the largest stream first; another device's segments left out."""
    from core.train.profiling import reserved_breakdown

    def segment(stream, blocks, device=0):
        return {"device": device, "stream": stream, "total_size": sum(size for size, _ in blocks),
                "allocated_size": sum(size for size, state in blocks if state == "active_allocated"),
                "blocks": [{"size": size, "state": state} for size, state in blocks]}

    segments = [segment(0, [(512 * MIB, "active_allocated"), (256 * MIB, "inactive")]),
                segment(7, [(1024 * MIB, "inactive"), (1024 * MIB, "inactive"), (2048 * MIB, "active_allocated")]),
                segment(0, [(4096 * MIB, "active_allocated")], device=1)]
    text = reserved_breakdown(segments, device=0, peak_reserved_gib=4.75)
    lines = [line for line in text.splitlines() if line.startswith("stream")]
    assert lines == ["stream 7: 4.00 GiB in 1 segments, 2.00 allocated, 2.00 free in 2 blocks (largest 1024, 1024 MiB)",
                     "stream 0: 0.75 GiB in 1 segments, 0.50 allocated, 0.25 free in 1 blocks (largest 256 MiB)"]
    assert "max_memory_reserved 4.75 GiB" in text
