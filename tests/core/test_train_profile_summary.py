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
