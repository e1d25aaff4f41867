"""``offload_activations`` pins every checkpointed block's input in host memory: ``train`` and ``resume``
refuse a run the box's available memory cannot hold and warn when it takes most of it (figures named)."""

from __future__ import annotations

from core.runs.host_memory import check_offload_ram, offload_need

GIB = 1024**3
RUN = {"model": "Qwen2.5-7B", "method": "qlora", "micro_batch_size": 1, "max_seq_len": 98304,
       "gradient_checkpointing": True, "offload_activations": True}


def test_the_need_is_layers_times_tokens_times_hidden_in_the_residual_dtype():
    need = offload_need(RUN)
    assert (need.layers, need.tokens, need.hidden, need.width) == (28, 98304, 3584, 2)
    assert need.bytes == 28 * 98304 * 3584 * 2  # 19.7 GB, as the estimator's host RAM counts it
    assert offload_need({**RUN, "checkpoint_layers": 10}).layers == 10
    assert offload_need({**RUN, "micro_batch_size": 2}).tokens == 2 * 98304
    assert offload_need({**RUN, "qlora_upcast": True}).width == 4  # an fp32 residual stream
    assert offload_need({**RUN, "offload_activations": False}) is None
    assert offload_need({**RUN, "gradient_checkpointing": False}) is None
    assert offload_need({**RUN, "model": "/no/such/model"}) is None


def test_short_close_and_ok_with_the_figures_in_the_message():
    short = check_offload_ram(RUN, available=16 * GIB)
    assert short.verdict == "short"
    text = short.message.text()
    assert "18.4 GiB" in text and "16.0 GiB available" in text and "(28 layers x 98,304 tokens" in text
    assert "max_seq_len" in text and "offload_activations: false" in text
    assert check_offload_ram(RUN, available=25 * GIB).verdict == "close"
    assert check_offload_ram(RUN, available=256 * GIB).verdict == "ok"
    assert check_offload_ram({**RUN, "offload_activations": False}, available=GIB) is None


def test_the_launch_check_refuses_with_the_cli_exit_code_and_warns_when_close():
    """The check sits where train's and resume's other launch checks sit (core.runs.lifecycle)."""
    import pytest

    from core.runs import lifecycle
    from core.runs.errors import RunError

    warnings = []
    with pytest.raises(RunError) as refused:
        lifecycle._check_host_memory(RUN, warnings.append, available=8 * GIB)
    assert refused.value.code == 2 and "8.0 GiB available" in str(refused.value)
    lifecycle._check_host_memory(RUN, warnings.append, available=30 * GIB)
    assert len(warnings) == 1 and "pin 18.4 GiB" in warnings[0]


def test_available_memory_is_read_from_this_box():
    import psutil

    from core.runs.host_memory import available_bytes

    have = available_bytes()
    assert have and 0 < have <= psutil.virtual_memory().total


def test_every_training_process_on_the_box_parks_its_own_micro_batch():
    """Eight ranks on one box pin eight micro-batches' inputs: the check counts them all (it counted one)."""
    assert offload_need(RUN, processes=8).bytes == 8 * offload_need(RUN).bytes
    assert check_offload_ram(RUN, available=100 * GIB).verdict == "ok"  # one process: 18.4 of 100 GiB
    short = check_offload_ram(RUN, available=100 * GIB, processes=8)  # eight: 147 GiB
    assert short.verdict == "short" and "147.0 GiB" in short.message.text()
    assert "8 training processes x 28 layers" in short.message.text()
