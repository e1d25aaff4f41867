"""The activation model against what autograd really keeps, on tiny real transformers/peft models (CPU).

Every tensor autograd saves goes through a saved-tensors hook; the ones still alive when the forward
pass ends (the graph holds them) are what a GPU must keep for backward. Subtracting a 2-block model
from a 3-block one, and 128 tokens from 256, leaves the bytes per token of one middle block: the
estimator's ``block_activations`` must predict exactly that.

``test_whole_step_peak_matches_memtracker`` goes further: the whole step's peak of live tensors,
tracked by torch's MemTracker, against the estimator's peak phase without context and slack.

CPU-only differences are kept out: dropout masks are 1-byte on CUDA but 4-byte on CPU (so dropout is 0
here), and Liger's kernels need a GPU (bench/estimate_matrix.py measures those).
"""

from __future__ import annotations

import weakref
from dataclasses import replace

import pytest

from core.estimate import TrainingPlan, architecture_from_config
from core.estimate.activations import block_activations
from core.estimate.calibration import DEFAULT_CALIBRATION
from core.estimate.precision import precision_layout

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

BASE = {"hidden_size": 64, "intermediate_size": 160, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "vocab_size": 300, "tie_word_embeddings": False}


def kept_bytes(config: dict, method: str, precision: str, tokens: int, rank: int = 8) -> int:
    """Bytes of non-parameter storage autograd keeps at the end of the forward pass (loss included);
    ``lora-grouped``: LoRA with the engine's grouped linears (``core.train.lora_group``)."""
    torch.manual_seed(0)
    hf_config = transformers.AutoConfig.for_model(**config)
    grouped = method == "lora-grouped"
    method = "lora" if grouped else method
    full = method == "full"
    fp32_weights = precision == "fp32" or (full and precision == "bf16")
    dtype = torch.float32 if fp32_weights else torch.bfloat16
    model = transformers.AutoModelForCausalLM.from_config(hf_config, attn_implementation="sdpa", dtype=dtype)
    if not full:
        lora = peft.LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules="all-linear",
                               use_dora=method == "dora", task_type="CAUSAL_LM")
        model = peft.get_peft_model(model, lora)
        if grouped:
            from core.train.lora_group import group_lora_layers

            assert group_lora_layers(model) > 0
    model.train()
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    packed: list[tuple[weakref.ref, int, int]] = []

    def pack(tensor):
        storage = tensor.untyped_storage()
        packed.append((weakref.ref(tensor), storage.data_ptr(), storage.nbytes()))
        return tensor

    ids = torch.randint(0, config["vocab_size"], (1, tokens))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision != "fp32"):
            loss = model(input_ids=ids, labels=ids).loss
    alive = {ptr: size for ref, ptr, size in packed if ref() is not None and ptr not in parameters}
    del loss
    return sum(alive.values())


def measured_block_bytes_per_token(config: dict, method: str, precision: str) -> float:
    def per_token(layers: int) -> float:
        sized = dict(config, num_hidden_layers=layers)
        return (kept_bytes(sized, method, precision, 256) - kept_bytes(sized, method, precision, 128)) / 128

    return per_token(3) - per_token(2)


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])
@pytest.mark.parametrize(("method", "precision"), [
    ("lora", "bf16"),
    ("lora-grouped", "bf16"),
    ("full", "bf16"),
    ("full", "pure-bf16"),
    ("full", "fp32"),
    ("lora", "fp32"),
    ("dora", "bf16"),
])
def test_block_activations_match_what_autograd_keeps(model_type, method, precision):
    config = dict(BASE, model_type=model_type)
    arch = architecture_from_config(dict(config, num_hidden_layers=3))
    plan = TrainingPlan(architecture=arch, method=method.removesuffix("-grouped"), precision=precision, lora_rank=8,
                        lora_dropout=0.0, lora_grouped=method == "lora-grouped",  # else plain peft
                        fused_ce=False, gradient_checkpointing=False,
                        lora_swiglu_fused=False)  # the SwiGLU kernels run on GPUs (run_plan: a CPU run's plan)
    layout = precision_layout(plan, DEFAULT_CALIBRATION.adam8bit_bytes_per_param)
    predicted = block_activations(arch, plan, layout, DEFAULT_CALIBRATION)
    assert predicted.per_block == 0
    # Exact for these versions; the tolerance only absorbs a future op that saves a few bytes more.
    assert predicted.per_token == pytest.approx(measured_block_bytes_per_token(config, method, precision), rel=0.005)


def step_peak_bytes(config: dict, method: str, precision: str, checkpointing: bool, batch: int, seq: int) -> float:
    """Peak bytes of live tensors over a training step (2nd step), tracked by torch's MemTracker on CPU."""
    from torch.distributed._tools.mem_tracker import MemTracker

    class FrozenFriendlyTracker(MemTracker):
        # MemTracker hooks every parameter's gradient, which frozen (LoRA base) parameters refuse.
        def _track_module_params_and_buffers(self, module, install_grad_hooks=True):
            return super()._track_module_params_and_buffers(module, install_grad_hooks=False)

    torch.manual_seed(0)
    full = method == "full"
    dtype = torch.float32 if precision == "fp32" or (full and precision == "bf16") else torch.bfloat16
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config),
                                                          attn_implementation="sdpa", dtype=dtype)
    if checkpointing:
        if not full:
            model.enable_input_require_grads()
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if not full:
        model = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                                                           target_modules="all-linear", task_type="CAUSAL_LM"))
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], foreach=True)
    ids = torch.randint(0, config["vocab_size"], (batch, seq))
    tracker = FrozenFriendlyTracker()
    tracker.track_external(model, optimizer)
    with tracker:
        for step in range(2):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision != "fp32"):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del loss
            if step == 0:
                tracker.reset_mod_stats()  # the first step allocates the optimizer state
    snapshot = tracker.get_tracker_snapshot("peak")
    return next(stats for device, stats in snapshot.items() if str(device) == "cpu")["Total"]


@pytest.mark.parametrize(("vocab", "method", "precision", "checkpointing", "batch", "seq"), [
    (2000, "full", "bf16", False, 2, 256),  # peak at the loss: logits dominate
    (2000, "full", "bf16", True, 1, 256),
    (64, "full", "pure-bf16", True, 2, 1024),  # peak in checkpointed backward
    (64, "lora", "bf16", True, 2, 1024),
    (64, "lora", "bf16", False, 2, 512),  # peak at the start of backward
])
def test_whole_step_peak_matches_memtracker(vocab, method, precision, checkpointing, batch, seq):
    from core.estimate import Calibration, count_parameters, find_gpu
    from core.estimate.memory import memory_phases

    config = dict(BASE, model_type="qwen2", hidden_size=128, intermediate_size=320, head_dim=32,
                  num_hidden_layers=4, vocab_size=vocab)
    arch = architecture_from_config(config)
    plan = TrainingPlan(architecture=arch, method=method, precision=precision, lora_rank=8, lora_dropout=0.0,
                        lora_grouped=False,  # plain peft, as these models run
                        fused_ce=False, gradient_checkpointing=checkpointing, micro_batch_size=batch, seq_len=seq,
                        optimizer="adamw",  # the foreach AdamW measured below
                        lora_input_upcast=True)  # plain peft casts the adapters' inputs to their fp32
    # Tensors only: no CUDA context, no allocator slack on the CPU tracker. Full fine-tuning's recompute factor:
    # the H200 fit's (1.76) comes from its one identifying row, a 0.5B in 37 MLP tiles at 32k tokens; on these
    # tiny untiled blocks MemTracker measures 1.25. The factor is not free of the shape (an open point of #19).
    base = Calibration()
    calibration = replace(base, cuda_context_gib={"hopper": 0.0}, allocator_slack_floor_gib=0.0,
                          allocator_slack_fraction=dict.fromkeys(base.allocator_slack_fraction, 0.0),
                          checkpoint_recompute_layers={**base.checkpoint_recompute_layers, "full": 1.25})
    phases = memory_phases(arch, count_parameters(arch), plan, find_gpu("H200"), calibration)
    estimated = sum(phases.peak.values())
    measured = step_peak_bytes(config, method, precision, checkpointing, batch, seq)
    print(f"estimated {estimated / 2**20:.2f} MiB ({phases.peak_phase}), measured {measured / 2**20:.2f} MiB")
    assert estimated == pytest.approx(measured, rel=0.05)
