"""Every test starts from a fresh dynamo cache, fresh polytile counters and a fixed seed."""
import pytest
import torch

import polytile


@pytest.fixture(autouse=True)
def _fresh_state():
    torch.manual_seed(0)
    torch._dynamo.reset()
    polytile.reset_stats()
    yield
    torch._dynamo.reset()
