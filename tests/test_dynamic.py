"""Dynamic shapes: symbolic sizes as parameters of the compiled code (``graph.symbols``).

One compiled graph must serve every size (1 excluded: dynamo specializes it), sizes never seen
at compile time included, and give eager's results by the accuracy rule; the number of native
compiles must stay bounded whatever sizes follow."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import polytile
from polytile.accuracy import assert_accurate
from polytile.compiler import compile_graph_ir
from polytile.graph.builder import GraphBuilder, contiguous_strides
from polytile.graph.symbols import Sym, SymbolicSize, solve
from polytile.options import Options
from polytile.runtime.loader import InputMismatchError, TensorSpec

SIZES = (2, 3, 7, 16, 61, 128)


def assert_close(res, ref, fp64=None):
    """The accuracy rule of DESIGN.md (``fp64``: the float64 reference, when one is at hand)."""
    assert_accurate(res, ref, fp64, 1e-5)


# ---------------------------------------------------------------- the size algebra
def test_sizes_are_polynomials_with_decided_comparisons():
    s, t = Sym.symbol("s"), Sym.symbol("t")
    assert (s + 1) - s == 1 and isinstance((s + 1) - s, int)
    assert 16 * (s + 1) == 16 * s + 16
    assert s * t == t * s and s * t != s * s
    assert (64 * s) // 16 == 4 * s and (4 * s + 8) % 4 == 0
    assert s != 1 and s > 1 and max(s, 1) == s  # dynamo proves every dynamic size >= 2
    assert s + 1 > s and not (s < 2) and min(s, s + 3) == s
    for undecided in (lambda: s < t, lambda: s > 3, lambda: range(s), lambda: int(s), lambda: (s + 1) // 2):
        with pytest.raises(SymbolicSize):
            undecided()
    assert (3 * s + t).eval({"s": 5, "t": 2}) == 17


def test_solve_binds_symbols_from_sizes_and_rejects_contradictions():
    s, t = Sym.symbol("s"), Sym.symbol("t")
    env = {}
    assert solve([4, s + 1, 16 * t], [4, 10, 48], env) and env == {"s": 9, "t": 3}
    assert not solve([s, s], [5, 6], {})  # one symbol, two values
    assert not solve([2 * s], [7], {})  # no integer solution
    assert not solve([s], [1], {})  # below the symbol's lower bound
    assert not solve([4], [5], {})


# ---------------------------------------------------------------- parametric graph IR
def _compile(graph, name):
    specs = [TensorSpec(n.shape, contiguous_strides(n.shape), n.dtype) for n in graph.inputs]
    return compile_graph_ir(graph, specs, Options(), name)


def test_one_parametric_graph_runs_every_size():
    """concat along a symbolic axis, elementwise maps and a softmax over it, a reduction:
    compiled once; the C source takes the size as a parameter."""
    s = Sym.symbol("s")
    b = GraphBuilder()
    x = b.input(0, (2, s, 8), "float32")
    y = b.input(1, (2, 1, 8), "float32")
    cat = b.concat([x, y], 1)
    e = b.ew("exp", b.ew("sub", cat, b.reduce("reduce_max", cat, [1], True)))
    soft = b.ew("div", e, b.reduce("reduce_sum", e, [1], True))
    total = b.reduce("reduce_sum", b.ew("mul", cat, 3.0), [1, 2])
    g = b.graph([cat, soft, total])
    before = polytile.stats()["graphs_compiled"]
    f = _compile(g, "dyn_ir")
    assert polytile.stats()["graphs_compiled"] == before + 1
    for n in SIZES:
        xs, ys = torch.randn(2, n, 8), torch.randn(2, 1, 8)
        xs[0, 0, 0], xs[1, n - 1, 3] = float("inf"), float("nan")
        c, sm, tot = f(xs, ys)
        ref = torch.cat([xs, ys], 1)
        torch.testing.assert_close(c, ref, rtol=0, atol=0, equal_nan=True)
        assert_close(sm, torch.softmax(ref, 1), lambda: torch.softmax(ref.double(), 1))
        assert_close(tot, (ref * 3.0).sum((1, 2)), lambda: (ref.double() * 3.0).sum((1, 2)))
    with pytest.raises(InputMismatchError):
        f(torch.randn(2, 5, 8), torch.randn(2, 2, 8))  # a static size differs
    with pytest.raises(InputMismatchError):
        f(torch.randn(3, 5, 8), torch.randn(2, 1, 8))


# ---------------------------------------------------------------- through torch.compile
def _decode_attention(q, k_cache, k, v_cache, v):
    keys, values = torch.cat([k_cache, k], 2), torch.cat([v_cache, v], 2)
    return F.scaled_dot_product_attention(q, keys, values), keys, values


@pytest.mark.parametrize("machine", [None, {"preset": "zen3"}, {"vector_bytes": 16}])
def test_decoding_attention_compiles_once_for_every_key_length(machine):
    """A decoding step: the KV cache grows by one key per call."""
    torch._dynamo.reset()
    f = torch.compile(_decode_attention, backend="polytile", options={"fallback": False, "machine": machine})
    st0 = polytile.stats()
    for n in SIZES + (1000,):
        q = torch.randn(1, 4, 1, 16)
        kc, vc = torch.randn(1, 4, n, 16), torch.randn(1, 4, n, 16)
        k, v = torch.randn(1, 4, 1, 16), torch.randn(1, 4, 1, 16)
        if n == SIZES[0]:
            kc[0, 1, 0, 0] = float("nan")  # one head sees a NaN key
        torch._dynamo.mark_dynamic(kc, 2)
        torch._dynamo.mark_dynamic(vc, 2)
        out = f(q, kc, k, vc, v)
        ref = _decode_attention(q, kc, k, vc, v)
        assert_close(out, ref, lambda: _decode_attention(*(a.double() for a in (q, kc, k, vc, v))))
    st = polytile.stats()
    assert st["parametric_graphs"] - st0["parametric_graphs"] == 1
    assert st["graphs_compiled"] - st0["graphs_compiled"] == 1
    assert st["eager_runs"] == st0["eager_runs"]


def test_key_and_value_lengths_that_differ_run_as_in_eager():
    """The compiled code assumes what SDPA requires (one length for keys and values); a call
    where they differ does not fit it and runs in ATen, as in eager (its error, or whatever its
    kernel makes of it), never through code compiled for other sizes."""
    torch._dynamo.reset()
    f = torch.compile(_decode_attention, backend="polytile")
    args = [torch.randn(1, 2, 1, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 1, 8), torch.randn(1, 2, 5, 8),
            torch.randn(1, 2, 1, 8)]
    for a in args[1::2]:
        torch._dynamo.mark_dynamic(a, 2)
    assert_close(f(*args), _decode_attention(*args))
    bad = list(args)
    bad[3] = torch.randn(1, 2, 6, 8)
    runs = polytile.stats()["eager_runs"]
    try:
        ref = _decode_attention(*bad)
    except RuntimeError:
        with pytest.raises(RuntimeError):
            f(*bad)
    else:  # (eager's kernel accepts it, reading values with the keys' length: no value to compare)
        assert [o.shape for o in f(*bad)] == [r.shape for r in ref]
    assert polytile.stats()["eager_runs"] == runs + 1


def test_symbolic_matmuls_get_few_versions_then_the_parametric_one():
    """A prefill-like graph (linear layers over a symbolic token count): the first sizes get
    their own versions, every later size the parametric graph; all give eager's results."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.GELU(), torch.nn.LayerNorm(48),
                            torch.nn.Linear(48, 8)).eval()
    f = torch.compile(m, backend="polytile", options={"max_specializations": 2, "fallback": False})
    st0 = polytile.stats()
    with torch.no_grad():
        for n in (3, 5, 7, 11, 2, 64, 97, 5):
            x = torch.randn(2, n, 32)
            assert_close(f(x), m(x), lambda: m.double()(x.double()))
            m.float()
    st = polytile.stats()
    assert st["specialized_versions"] - st0["specialized_versions"] == 2
    assert st["parametric_graphs"] - st0["parametric_graphs"] == 1


def test_specialize_option_compiles_per_size():
    torch._dynamo.reset()
    lin = torch.nn.Linear(8, 8).eval()
    f = torch.compile(lin, backend="polytile", options={"dynamic": "specialize"})
    st0 = polytile.stats()
    with torch.no_grad():
        for n in (3, 4, 5, 6):
            x = torch.randn(n, 8)
            assert_close(f(x), lin(x))
    st = polytile.stats()
    assert st["parametric_graphs"] == st0["parametric_graphs"]
    assert st["specialized_versions"] - st0["specialized_versions"] == 3  # the first size is static


def test_dynamic_option_is_checked():
    with pytest.raises(ValueError, match="dynamic"):
        Options.from_dict({"dynamic": "always"})


# ---------------------------------------------------------------- parallel loops with symbolic sizes
def _nest(outer_hi, inner_hi, index, extra=()):
    from polytile.affine.ir import Const, For, Load, Store, Var, c

    body = (Store("out", index, Load("inp", Var("j"), "float32")),) + tuple(extra)
    return For("i", c(0), outer_hi, (For("j", c(0), inner_hi, body),), parallel=True)


def test_writes_proved_apart_with_symbolic_strides():
    """isl cannot state i * s; the index polynomials can: rows of s elements never overlap,
    rows of s + 1 elements laid s apart do, and an index read back differently is refused."""
    from polytile.affine.ir import Load, Store, Var, add, c, mul
    from polytile.transform.parallelize import separated_writes

    s = Var("sz_s")
    i, j = Var("i"), Var("j")
    assert separated_writes(_nest(c(4), s, add(mul(i, s), j)))
    assert separated_writes(_nest(s, c(16), add(mul(i, c(16)), j)))
    assert not separated_writes(_nest(c(4), add(s, c(1)), add(mul(i, s), j)))
    assert not separated_writes(_nest(c(4), s, j))  # every i writes the same row
    reread = Store("out", c(0), Load("out", add(mul(i, s), j), "float32"))
    assert not separated_writes(_nest(c(4), s, add(mul(i, s), j), [reread]))
    scalar = add(mul(i, s), Var("ix"))  # an index computed in the loop: not provable
    assert not separated_writes(_nest(c(4), s, scalar))


def test_decoding_attention_runs_its_heads_in_parallel_when_the_cache_is_long(tmp_path):
    """Structure (2 threads pinned): the attention's head loops are an OpenMP band (a block of
    keys per head is work enough), and the copy of the cache runs on the threads when the key
    length of the call makes it large enough."""
    torch._dynamo.reset()
    f = torch.compile(_decode_attention, backend="polytile", options={"threads": 2, "dump_dir": str(tmp_path)})
    args = [torch.randn(1, 8, 1, 64), torch.randn(1, 8, 40, 64), torch.randn(1, 8, 1, 64),
            torch.randn(1, 8, 40, 64), torch.randn(1, 8, 1, 64)]
    for a in args[1::2]:
        torch._dynamo.mark_dynamic(a, 2)
    assert_close(f(*args), _decode_attention(*args))
    (src,) = tmp_path.glob("*/*kernel.c")
    text = src.read_text()
    attention = text[text.index("/* attention"):]
    attention = attention[:attention.index("\n}\n")]
    assert "#pragma omp parallel for collapse(" in attention
    copies = text.replace(attention, "")
    assert "#pragma omp parallel for" in copies and " if(" in copies


def _prefill_attention(q, k, v, mask):
    n = q.shape[2]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    return (F.scaled_dot_product_attention(q, k, v, is_causal=True),
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
            # masks built from indices (as Hugging Face builds them): causal steps with offsets
            F.scaled_dot_product_attention(q, k, v, attn_mask=j <= i),
            F.scaled_dot_product_attention(q, k, v, attn_mask=i + 2 >= j),
            F.scaled_dot_product_attention(q, k, v, attn_mask=j < i))


@pytest.mark.parametrize("machine", [None, {"preset": "zen3"}, {"vector_bytes": 16}])
def test_prefill_attention_runs_in_blocks_of_keys_at_every_length(machine):
    """Queries and keys of one symbolic length (a prefill), causal, with a boolean mask that
    hides every key of one query row (its output: eager's NaN), and with masks computed from
    indices (rewritten into causal steps: offsets 0, 2 and -1, whose first row sees no key),
    at lengths around the key block (4 vectors: 64, 32 or 16 keys): the last block partial
    or full."""
    torch._dynamo.reset()
    f = torch.compile(_prefill_attention, backend="polytile", options={"fallback": False, "machine": machine})
    st0 = polytile.stats()
    for n in (2, 15, 16, 17, 63, 64, 65, 130):
        q, k, v = (torch.randn(1, 3, n, 16) for _ in range(3))
        mask = torch.rand(1, 1, n, n) > 0.3
        mask[..., n // 2, :] = False
        if n == 17:
            k[0, 1, 5, 2] = float("inf")  # one head sees an infinite key
        for t in (q, k, v, mask):
            torch._dynamo.mark_dynamic(t, 2)
        torch._dynamo.mark_dynamic(mask, 3)
        out = f(q, k, v, mask)
        ref = _prefill_attention(q, k, v, mask)
        for o, r in zip(out, ref):
            torch.testing.assert_close(o, r, rtol=1e-4, atol=1e-5, equal_nan=True)
    st = polytile.stats()
    assert st["graphs_compiled"] - st0["graphs_compiled"] == 1
    assert st["eager_runs"] == st0["eager_runs"]


def test_index_masks_with_symbolic_sizes_become_causal_offsets():
    """The mask a model builds from two iotas (key index j along the last axis, query index i
    along the one before) is recognized from its form when its size is symbolic."""
    from polytile.graph.attention import causal_offset

    s = Sym.symbol("s")
    b = GraphBuilder()
    j = b.reshape(b.iota(s, "int64"), (1, s))
    i = b.reshape(b.iota(s, "int64"), (s, 1))
    assert causal_offset(b.ew("le", j, i), "keep", -math.inf) == 0
    assert causal_offset(b.ew("ge", b.ew("add", i, 3), j), "keep", -math.inf) == 3
    assert causal_offset(b.ew("lt", j, i), "keep", -math.inf) == -1
    assert causal_offset(b.ew("gt", j, i), "drop", -math.inf) == 0  # dropped: the keys after the row
    assert causal_offset(b.ew("le", i, j), "keep", -math.inf) is None  # j >= i: not causal
    assert causal_offset(b.ew("le", j, i), "keep", 0.0) is None  # a finite fill is not a mask
