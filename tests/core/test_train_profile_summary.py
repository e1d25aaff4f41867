"""``TUNEDECK_PROFILE``'s summary: what the torch profiler's averages of a few steps say (no GPU needed to
check the arithmetic; on the GPU it ran through bench/calibration_matrix.py --profile)."""

from __future__ import annotations


def test_a_gpu_profile_says_where_the_host_time_goes():
    """A launch-bound step (kernels a tenth of the wall time) is read from its host side: the summary lists
    the operators and CUDA runtime calls by self CPU time after the kernels, a sync among them. Hardware:
    none; the profiler's averages are given as they come from a CUDA run (kernels as CUDA events)."""
    from types import SimpleNamespace

    from core.train.profiling import summarise

    def event(key, kind, device_us=0.0, cpu_us=0.0, count=2):
        return SimpleNamespace(key=key, device_type=f"DeviceType.{kind}", self_device_time_total=device_us,
                               self_cpu_time_total=cpu_us, count=count)

    averages = [event("nvjet_sm90_tst_192x128", "CUDA", device_us=80_000), event("fused_dropout", "CUDA", device_us=20_000),
                event("cudaLaunchKernel", "CPU", cpu_us=300_000, count=13_000), event("aten::mm", "CPU", cpu_us=60_000),
                event("cudaStreamSynchronize", "CPU", cpu_us=140_000, count=56)]
    text = summarise(SimpleNamespace(key_averages=lambda: averages), steps=2, wall_s=1.0)
    assert "self device time 50.0 ms per step" in text  # the kernels only
    assert "wall 500.0 ms per step; kernels 10% of it" in text
    host = text.split("## host side: self CPU time 250.0 ms per step")[1]
    lines = [line for line in host.splitlines() if line.strip()]
    assert lines[0].endswith("cudaLaunchKernel") and "150.00 ms/step" in lines[0] and "x6500" in lines[0]
    assert lines[1].endswith("cudaStreamSynchronize") and "70.00 ms/step" in lines[1]
    assert "nvjet" not in host  # kernels are not host time
    # a CPU run has no kernels: its operators are the table, and there is no second host table
    assert "## host side" not in summarise(SimpleNamespace(key_averages=lambda: averages[2:]), steps=2, wall_s=1.0)


def test_the_sync_trace_records_each_synchronising_site_for_its_steps_only(tmp_path, monkeypatch):
    """``TUNEDECK_SYNC_TRACE=2:2``: the sites of steps 2-3 by count a step, with their Python stacks; other
    warnings are not counted, and the window closes. Hardware: none; torch's sync debug mode (CUDA only) is
    replaced by a recorder and its warning raised as torch raises it, from the synchronising call's frame."""
    import warnings
    from types import SimpleNamespace

    import torch

    from core.train.profiling import SyncTraceCallback

    modes = []
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)

    def item_of_the_loss():
        warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)

    def blocking_upload():
        warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)

    trace = SyncTraceCallback(tmp_path, 2, 2)
    state = SimpleNamespace(global_step=0)
    trace.on_train_begin(None, state, None)
    item_of_the_loss()  # step 1: outside the window
    state.global_step = 1
    trace.on_step_end(None, state, None)
    assert modes == ["warn"]
    for step in (2, 3):
        blocking_upload()
        for _ in range(2):  # one site (the same stack) twice
            item_of_the_loss()
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn("something else", UserWarning, stacklevel=1)
        state.global_step = step
        trace.on_step_end(None, state, None)
    assert modes == ["warn", 0]
    text = (tmp_path / "syncs.txt").read_text()
    assert text.startswith("# 6 host synchronisations in 2 steps (3.0 a step)")
    blocks = text.split("\n\n")[1:]
    assert "2.0 a step" in blocks[0] and blocks[0].splitlines()[-1].endswith("item_of_the_loss")
    assert "1.0 a step" in blocks[1] and blocks[1].splitlines()[-1].endswith("blocking_upload")
    assert "test_the_sync_trace_records" in blocks[0]  # the callers' frames too
    item_of_the_loss()  # after the window: nothing more recorded
    assert (tmp_path / "syncs.txt").read_text() == text


def test_device_idle_finds_the_gaps_between_kernels_and_those_after_a_sync():
    """The timeline of two steps: kernels on two streams (overlapping ones are one busy span), a 2 ms gap in
    which a ``cudaStreamSynchronize`` returned, a 0.5 ms gap without one and small launch gaps. Hardware:
    none; the events are given as the profiler's, kernels as CUDA events on the host's clock (µs)."""
    from types import SimpleNamespace

    from core.train.profiling import device_idle

    def event(name, kind, start, end):
        return SimpleNamespace(name=name, device_type=f"DeviceType.{kind}", time_range=SimpleNamespace(start=start, end=end))

    events = [event("gemm_a", "CUDA", 0, 1000), event("copy_b", "CUDA", 500, 1200),  # overlap: busy to 1200
              event("norm_c", "CUDA", 1205, 1300),  # 5 µs launch gap
              event("cudaStreamSynchronize", "CPU", 1250, 1310),  # returns within the next gap
              event("loss_d", "CUDA", 3300, 4000),  # 2 ms after the sync
              event("add_e", "CUDA", 4500, 4600),  # 0.5 ms, no sync
              event("cudaLaunchKernel", "CPU", 4100, 4110),
              event("adam_f", "CUDA", 4650, 5000)]  # 50 µs
    text = device_idle(events, steps=2)
    assert "## device idle: 1.3 ms per step between kernels, in 2 gaps a step" in text  # 2555 µs over 2 steps
    assert "after a host synchronisation: 0.5 gaps a step, 1.0 ms/step" in text
    largest = text.split("largest gaps")[1].splitlines()[2:]
    assert largest[0].split()[:2] == ["2.00", "at"] and " sync " in largest[0]
    assert "after norm_c" in largest[0] and "before loss_d" in largest[0]
    assert largest[1].startswith("   0.50") and " sync " not in largest[1] and "after loss_d" in largest[1]
    assert ">= 1 ms" in text and "0.5 gaps a step      1.0 ms/step" in text.split(">= 1 ms")[1].splitlines()[0]
    assert device_idle(events[:1], steps=1) == ""  # one kernel: no gap
