"""Test tiers (DESIGN §5): plan/IR/codegen-text tests run no kernels; interpreter
tests run generated kernels on CPU tensors under TRITON_INTERPRET=1; `gpu` tests need
CUDA and are skipped cleanly without it."""
import os

# must be set before triton is imported anywhere
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("STITCHML_POISON_OUTPUTS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
