"""Faults around the compiled path: the C compiler missing or failing, a corrupted object in
the cache, an unusable cache directory, a full disk, processes building one graph into one cache. Each leaves the user's program running
(through ATen where nothing could be compiled) with one clear warning, and never leaves a
cache entry that a later run would take for whole."""
from __future__ import annotations

import logging
import os
import subprocess
import sys

import torch

import polytile
from polytile.runtime import cache


def _fn(a, b):
    return torch.sigmoid(a) * b - 1


def _other(a, b):
    return torch.tanh(a @ b) + 2


def _run_both(options):
    a, b = torch.randn(6, 6), torch.randn(6, 6)
    for f in (_fn, _other):
        c = torch.compile(f, backend="polytile", options=options)
        torch.testing.assert_close(c(a, b), f(a, b))
        torch.testing.assert_close(c(b, a), f(b, a))


def _warnings(caplog):
    return [r for r in caplog.records if r.levelno >= logging.WARNING and r.name == "polytile"]


def _entries_whole(d):
    """Every object in the cache folder has its digest, no temporary file is left."""
    names = os.listdir(d)
    assert not [n for n in names if n.startswith((".tmp-", ".build-"))], names
    for n in names:
        if n.endswith(".so"):
            assert cache.intact(os.path.join(d, n)), n


def test_missing_compiler_runs_in_aten_with_one_warning(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="polytile"):
        _run_both({"cc": str(tmp_path / "no-such-cc"), "cache_dir": str(tmp_path / "c")})
    st = polytile.stats()
    assert st["graphs_compiled"] == 0 and st["graphs_failed"] == 2, st
    warns = _warnings(caplog)
    assert len(warns) == 1 and "no-such-cc" in warns[0].getMessage(), [w.getMessage() for w in warns]


def test_failing_compiler_runs_in_aten_with_one_warning(tmp_path, caplog):
    d = tmp_path / "c"
    with caplog.at_level(logging.WARNING, logger="polytile"):
        _run_both({"cflags": ("-O2", "-fno-such-flag-at-all"), "cache_dir": str(d)})
    st = polytile.stats()
    assert st["graphs_compiled"] == 0 and st["graphs_failed"] == 2, st
    warns = _warnings(caplog)
    assert len(warns) == 1 and "no-such-flag" in warns[0].getMessage(), [w.getMessage() for w in warns]
    _entries_whole(d)


def _so(d):
    (so,) = [os.path.join(d, n) for n in os.listdir(d) if n.endswith(".so")]
    return so


_FILL = r"""
import sys, torch, polytile
f = lambda a, b: torch.sigmoid(a) * b - 1
torch.compile(f, backend="polytile", options={"cache_dir": sys.argv[1]})(torch.randn(6, 6), torch.randn(6, 6))
"""


def _filled_cache(tmp_path) -> str:
    """A cache folder holding _fn's object, built by another process (this one has not loaded it)."""
    d = str(tmp_path / "c")
    r = subprocess.run([sys.executable, "-c", _FILL, d], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return d


def _replace(path: str, data: bytes) -> None:
    with open(path + ".new", "wb") as f:
        f.write(data)
    os.replace(path + ".new", path)


def _compile_fn_again(d):
    x, y = torch.randn(6, 6), torch.randn(6, 6)
    torch.testing.assert_close(torch.compile(_fn, backend="polytile", options={"cache_dir": d})(x, y), _fn(x, y))


def test_truncated_cached_object_is_rebuilt(tmp_path):
    d = _filled_cache(tmp_path)
    so = _so(d)
    with open(so, "rb") as f:
        data = f.read()
    _replace(so, data[: len(data) // 2])
    assert not cache.intact(so)
    _compile_fn_again(d)
    st = polytile.stats()
    assert (st["cache_misses"], st["cache_hits"], st["graphs_compiled"]) == (1, 0, 1), st
    _entries_whole(d)


def test_garbage_object_with_a_matching_digest_is_rebuilt(tmp_path):
    """An object that fails to load although its digest matches (written by something else)
    is removed and built again."""
    d = _filled_cache(tmp_path)
    so = _so(d)
    _replace(so, b"not an ELF file")
    _replace(cache.checksum_path(so), cache.file_digest(so).encode())
    _compile_fn_again(d)
    st = polytile.stats()
    assert st["graphs_compiled"] == 1 and st["graphs_failed"] == 0 and st["cache_hits"] == 1, st
    _entries_whole(d)


def test_unusable_cache_dir_compiles_into_a_private_temporary_one(tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("in the way")
    with caplog.at_level(logging.WARNING, logger="polytile"):
        _run_both({"cache_dir": str(blocker / "cache")})
    st = polytile.stats()
    assert st["graphs_compiled"] == 2 and st["graphs_failed"] == 0, st
    warns = _warnings(caplog)
    assert len(warns) == 1 and "not usable" in warns[0].getMessage(), [w.getMessage() for w in warns]


_FULL_DISK = r"""
import resource, signal, sys, torch, polytile
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))
f = lambda a, b: torch.relu(a) * b + a.sum()
a, b = torch.randn(5, 5), torch.randn(5, 5)
c = torch.compile(f, backend="polytile", options={"cache_dir": sys.argv[1]})
torch.testing.assert_close(c(a, b), f(a, b))
st = polytile.stats()
print("OK", st["graphs_compiled"], st["graphs_failed"])
"""


def test_full_disk_runs_in_aten_and_leaves_no_partial_entry(tmp_path):
    d = tmp_path / "c"
    r = subprocess.run([sys.executable, "-c", _FULL_DISK, str(d)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "OK 0 1" in r.stdout, (r.stdout, r.stderr[-2000:])
    assert r.stderr.count("compiling") == 1, r.stderr[-3000:]  # one warning
    _entries_whole(d)


def test_compile_over_its_budget_runs_in_aten(tmp_path, caplog):
    """A graph whose passes take longer than compile_budget_s is given up (checked between
    passes) and runs through ATen, with a warning."""
    with caplog.at_level(logging.WARNING, logger="polytile"):
        _run_both({"compile_budget_s": 0.0, "cache_dir": str(tmp_path / "c")})
    st = polytile.stats()
    assert st["graphs_compiled"] == 0 and st["graphs_failed"] == 2, st
    assert any("compile_budget_s" in w.getMessage() for w in _warnings(caplog))


_RACE = r"""
import sys, torch, polytile
torch.manual_seed(int(sys.argv[2]))
a, b = torch.randn(40, 30), torch.randn(30, 20)
f = lambda a, b: torch.softmax(torch.tanh(a @ b) * 3, -1)
out = torch.compile(f, backend="polytile", options={"cache_dir": sys.argv[1], "fallback": False})(a, b)
torch.testing.assert_close(out, f(a, b))
st = polytile.stats()
assert st["graphs_compiled"] == 1 and st["graphs_failed"] == 0, st
print("ok", st["cache_hits"], st["cache_misses"])
"""


def test_processes_compiling_one_graph_into_one_cache_at_once(tmp_path):
    """Three interpreters compile the same graph into one cache directory at the same time:
    each gets a working graph (built by itself or loaded from another's entry), and the
    cache holds whole entries only."""
    d = str(tmp_path / "cache")
    procs = [subprocess.Popen([sys.executable, "-c", _RACE, d, str(k)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for k in range(3)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0 and out.startswith("ok"), err[-2000:]
    _entries_whole(d)
    assert len([n for n in os.listdir(d) if n.endswith(".so")]) == 1
