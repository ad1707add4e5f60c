"""Every test starts from a fresh dynamo cache, fresh polytile counters and a fixed seed; the
affine program is verified after every pass (Options.verify_passes)."""
import os

os.environ.setdefault("POLYTILE_VERIFY_PASSES", "1")
# The GPU backend's kernels run in Triton's CPU interpreter (these machines have no GPU); Triton
# reads this when it is first imported, which importing torch._dynamo does.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import polytile  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_state():
    torch.manual_seed(0)
    torch._dynamo.reset()
    polytile.reset_stats()
    yield
    torch._dynamo.reset()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The OpInfo conformance summary of tests/test_opinfo.py, when its sample tests ran."""
    import sys

    mod = sys.modules.get("test_opinfo")
    if mod is None:
        return
    reports = [r for cat in ("passed", "failed", "skipped", "xfailed", "xpassed")
               for r in terminalreporter.stats.get(cat, [])
               if getattr(r, "when", "call") in ("setup", "call") and "test_opinfo.py::test_opinfo" in r.nodeid]
    lines = mod.summary_lines(reports)
    if lines:
        terminalreporter.write_sep("=", "OpInfo conformance (tests/test_opinfo.py)")
        for line in lines:
            terminalreporter.write_line(line)
