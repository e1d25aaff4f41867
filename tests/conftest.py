"""The hardware every test assumes: a CPU, whatever the box has.

Tests state the hardware they need (fake GPU recordings, ``--hardware``) rather than take the machine's:
on a GPU box torch would otherwise pick CUDA and the engine its GPU defaults (fused AdamW, bf16, Liger),
and tests written for the CPU path would see another engine. CUDA is hidden before torch is imported,
for the tests and for every trainer, server and CLI process they start.

Triton's interpreter is switched on for the session (not for a GPU session), so that the tests that ask for
it (``TUNEDECK_TRITON_INTERPRET=1``) run the engine's Triton kernels on the CPU.

``TUNEDECK_TEST_GPU=1`` keeps the GPUs visible: then the tests marked ``gpu`` run (on the GPU machine:
``TUNEDECK_TEST_GPU=1 python -m pytest -m gpu``), and the others still take their own hardware.
"""

from __future__ import annotations

import os

import pytest

GPU_TESTS = os.environ.get("TUNEDECK_TEST_GPU") == "1"
if not GPU_TESTS:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    # Triton kernels (core.train.lora_dropout_kernel) run in Triton's CPU interpreter where a test asks for
    # it (TUNEDECK_TRITON_INTERPRET=1); Triton reads this switch once, when it is first imported
    os.environ["TRITON_INTERPRET"] = "1"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; runs only with TUNEDECK_TEST_GPU=1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if GPU_TESTS:
        return
    skip = pytest.mark.skip(reason="a GPU test: run it on a GPU box with TUNEDECK_TEST_GPU=1")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest):
    """One folder per test module for what its tests share: a finished tiny run (``finished_run``) is
    trained once per module in it."""
    return tmp_path_factory.mktemp(request.module.__name__.rpartition(".")[2].removeprefix("test_"))
