"""A run config as the estimator's plan (core.estimate.run_plan): one mapping for every place that
estimates a run the engine is about to train, resolving what the engine resolves at start."""

from __future__ import annotations

from core.config import RunConfig
from core.estimate.run_plan import plan_for_run, plan_options_for_run

RUN = {"model": "Qwen2.5-7B", "dataset": "sample", "method": "lora", "max_seq_len": 8192, "micro_batch_size": 2,
       "gradient_accumulation": 4, "lora_rank": 32, "lora_dropout": 0.0, "lora_targets": ["q_proj", "v_proj"],
       "optimizer": "adamw_bnb_8bit", "tiled_mlp": 4, "attn": "eager", "fused_ce": "chunked",
       "checkpoint_layers": 10, "offload_activations": True, "lora_input_upcast": True, "ce_chunk_tokens": 4096}


def test_every_key_the_engine_reads_reaches_the_plan():
    config = RunConfig.from_dict(RUN, source="<test>")
    plan = plan_for_run(config, num_gpus=2)
    assert (plan.method, plan.micro_batch_size, plan.seq_len, plan.grad_accum_steps) == ("lora", 2, 8192, 4)
    assert (plan.lora_rank, plan.lora_dropout, plan.lora_targets) == (32, 0.0, ("q_proj", "v_proj"))
    assert (plan.optimizer, plan.tiled_mlp, plan.attention) == ("adamw_8bit", 4, "eager")
    assert (plan.fused_ce, plan.fused_ce_impl, plan.ce_chunk_tokens, plan.ce_chunk) == (True, "chunked", 4096, 4096)
    assert (plan.checkpoint_layers, plan.offload_activations, plan.num_gpus) == (10, True, 2)
    assert plan.lora_input_upcast is True and plan_for_run({**RUN, "lora_input_upcast": False}).lora_input_upcast is False
    assert plan_for_run(RUN).num_gpus == 1  # the config's dict works as well as the RunConfig


def test_what_auto_means_is_what_the_engine_picks():
    options = plan_options_for_run({"model": "Qwen2.5-7B", "method": "full", "pure_bf16": True})
    assert options["precision"] == "pure-bf16" and options["optimizer"] == "adamw_fused"
    assert "lora_rank" not in options  # no adapter on a full fine-tune
    assert plan_options_for_run({"method": "lora"}, cuda=False)["optimizer"] == "adamw"  # torch's AdamW on a CPU
    # the fused loss: Liger where installed and on a GPU, else the chunked loss; off is off
    assert plan_options_for_run({"fused_ce": "auto"}, cuda=False)["fused_ce_impl"] == "chunked"
    assert plan_options_for_run({"fused_ce": False})["fused_ce"] is False
    assert plan_options_for_run({"checkpoint_layers": "auto"})["checkpoint_layers"] is None
    assert plan_options_for_run({"ce_chunk_tokens": "auto"})["ce_chunk_tokens"] is None  # the loss's own rule


def test_the_host_check_and_the_estimator_give_one_figure():
    from core.estimate.memory import activation_host_bytes
    from core.runs.host_memory import offload_need

    values = {**RUN, "gradient_checkpointing": True}
    need = offload_need(values, processes=4)
    assert need.bytes == activation_host_bytes(plan_for_run(values, 4))
    assert need.bytes == 4 * 10 * (2 * 8192) * 3584 * 2  # processes x checkpointed layers x tokens x hidden x bf16
