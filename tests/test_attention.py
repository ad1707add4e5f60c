"""Fused attention (issue 6): scaled_dot_product_attention and written-out attention become
one online-softmax kernel; results against eager (fp64 reference rule of DESIGN.md) over the
configs of shared/bench/attention_configs.csv and odd sizes, causal, additive and boolean
masks, grouped-query and cross attention; the rewrite's structure (no score-sized buffer)."""
from __future__ import annotations

import csv
import math
import os

import pytest
import torch
import torch.nn.functional as F

import polytile
from polytile.graph.attention import causal_offset, fuse_attention
from polytile.graph.builder import GraphBuilder

from accuracy import assert_accurate, fp64_reference
from machines import pinned

# shared/bench's file when the checkout sits next to it, else the copy in tests/fixtures (so a
# clone elsewhere still runs every config)
CSV = next(p for p in (os.path.join(os.path.dirname(__file__), "..", "..", "shared", "bench", "attention_configs.csv"),
                       os.path.join(os.path.dirname(__file__), "fixtures", "attention_configs.csv"))
           if os.path.exists(p))


def _configs():
    with open(CSV) as f:
        rows = [r for r in csv.DictReader(line for line in f if not line.startswith("#"))]
    return [(int(r["batch"]), int(r["heads"]), int(r["kv_heads"]), int(r["seq_q"]), int(r["seq_k"]),
             int(r["head_dim"]), r["causal"] == "true") for r in rows]


def _run(fn, args, **opts):
    torch._dynamo.reset()
    polytile.reset_stats()
    if "dump_dir" in opts:  # the test reads the generated code: that of the pinned machine
        opts.setdefault("machine", pinned())
    with torch.no_grad():
        out = torch.compile(fn, backend="polytile", options={"fallback": False, **opts})(*args)
        ref = fn(*args)
    st = polytile.stats()
    assert_accurate(out, ref, fp64_reference(fn, args), 1e-4)
    return st


def _qkv(B, H, KH, L, S, D, Dv=None):
    return (torch.randn(B, H, L, D), torch.randn(B, KH, S, D), torch.randn(B, KH, S, Dv or D))


def _sdpa(causal=False, gqa=False, scale=None):
    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa, scale=scale)
    return f


@pytest.mark.parametrize("cfg", _configs(), ids=lambda c: "x".join(str(int(v)) for v in c))
def test_attention_configs(cfg):
    B, H, KH, L, S, D, causal = cfg
    if B * H * L * S > 12 * 1024 * 1024 and not os.environ.get("POLYTILE_LONG_TESTS"):
        B = 1  # keep the default run short: the largest configs at batch 1
    st = _run(_sdpa(causal, KH != H), _qkv(B, H, KH, L, S, D))
    assert st.get("attention_fused", 0) == 1
    # the score matrix is never stored: intermediates are linear in the sequence lengths
    # (packed K and V, per query head)
    assert st["arena_bytes"] <= 4 * 4 * (B * H * L * D + 2 * B * H * S * D)


def test_long_sequence_memory_below_the_score_matrix():
    B, H, L, D = 1, 2, 2048, 64
    st = _run(_sdpa(True), _qkv(B, H, H, L, L, D))
    assert st.get("attention_fused", 0) == 1
    assert st["arena_bytes"] * 8 < B * H * L * L * 4


@pytest.mark.parametrize("L,S", [(1, 1), (1, 77), (7, 7), (77, 77), (7, 1000), (1000, 7), (77, 1000)])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_odd_sizes(L, S, causal):
    st = _run(_sdpa(causal), _qkv(2, 3, 3, L, S, 40, 24))
    assert st.get("attention_fused", 0) == 1


@pytest.mark.parametrize("L,Dv", [(7, 136), (77, 136), (5, 100), (64, 128), (40, 256)])
def test_wide_values_in_column_chunks(L, Dv):
    """V wider than four vectors: o += p . V runs over V's columns in chunks of four vectors (the
    last one partial: 136 = 8.5 vectors, 100 padded to 7), in both the query-major (few rows)
    and the key-major form; against eager."""
    st = _run(_sdpa(), _qkv(1, 2, 2, L, 90, 48, Dv))
    assert st.get("attention_fused", 0) == 1


@pytest.mark.parametrize("L", [64, 100])
def test_q_tile_transposed_in_registers(tmp_path, L):
    """Key-major form, Q an input (SDPA's sqrt(scale) factor folded into the pack): Q^T is
    packed in VW x VW register blocks (vector loads, shuffles, vector stores); a partial last
    query tile (L = 100) keeps the element loop for its rows; against eager."""
    _run(_sdpa(False), _qkv(1, 3, 3, L, 50, 32), dump_dir=str(tmp_path / "q"))
    main = _attention_kernel(tmp_path / "q")
    head = main.split("for (int64_t jt = ", 1)[0]
    assert "__builtin_shuffle" in head


def _attention_kernel(tmp_path) -> str:
    src = next(tmp_path.rglob("*kernel.c")).read_text()
    body = src[src.index("_attention(int pt_nthreads"):]
    return body[:body.index("\n}\n")]  # the online-softmax kernel's function only


def test_causal_mask_only_on_diagonal_tiles(tmp_path):
    """Key tiles every row of a query tile sees whole run without the causal test, in a loop
    of their own before the diagonal tiles."""
    _run(_sdpa(True), _qkv(1, 2, 2, 300, 300, 32), dump_dir=str(tmp_path / "a"))
    main = _attention_kernel(tmp_path / "a")
    assert main.count("for (int64_t jt = ") == 2


def test_constant_scale_folded_into_the_q_tile(tmp_path):
    """(q @ k^T) * c: the scale multiplies Q as it is packed, not every score."""
    def f(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) * 0.3, -1) @ v

    st = _run(f, _qkv(1, 2, 2, 100, 100, 32), dump_dir=str(tmp_path / "b"))
    assert st.get("attention_fused", 0) == 1
    main = _attention_kernel(tmp_path / "b")
    head, tiles = main.split("for (int64_t jt = ", 1)
    # how the renderer writes the constant: 100 query rows take the key-major form, which works
    # in base 2 (log2(e) joins the scale)
    from polytile.backends.cpu.attention import LOG2E
    c = float.hex(0.3 * LOG2E)
    assert c in head and c not in tiles and "pt_exp2_f32x" in tiles


def test_key_major_scores_from_32_query_rows(tmp_path):
    """From COLS_MIN_ROWS query rows the score tile is s[key][query]: the per-query max and sum
    run down its columns (no per-row reduction) and the rescale factors are vector exps."""
    from polytile.backends.cpu.attention import COLS_MIN_ROWS

    for L, name in ((COLS_MIN_ROWS - 1, "rows"), (COLS_MIN_ROWS, "cols")):
        _run(_sdpa(False), _qkv(1, 2, 2, L, 70, 32), dump_dir=str(tmp_path / name))
    rows, cols = _attention_kernel(tmp_path / "rows"), _attention_kernel(tmp_path / "cols")
    assert "reduction(max:" in rows and "reduction(max:" not in cols
    assert "&al[" in cols and "pt_exp2_f32x" in cols.split("&al[", 1)[1].split(";", 1)[0]  # (base 2)


def test_key_major_form_reads_k_and_v_in_place(tmp_path):
    """SDPA's decomposition scales K^T by a constant: the factor moves to the Q tile, K and V are
    read where they are - no pack kernel, no scaled copy of K. With grouped-query heads too: the
    graph's copies of K and V per query head (expand + clone) are dropped, query head h reads
    K and V's head h // G (``kv_group``)."""
    def calls(path):
        src = next(path.rglob("*kernel.c")).read_text()
        entry = src[src.index("int pt_entry("):]
        return [ln.split("(")[0].strip() for ln in entry.splitlines() if ln.strip().startswith("k") and "(nthreads" in ln]

    _run(_sdpa(False), _qkv(1, 4, 4, 40, 50, 32), dump_dir=str(tmp_path / "mha"))
    assert [c.split("_", 1)[1] for c in calls(tmp_path / "mha")] == ["attention"]
    _run(_sdpa(False, gqa=True), _qkv(1, 4, 2, 40, 50, 32), dump_dir=str(tmp_path / "gqa"))
    assert [c.split("_", 1)[1] for c in calls(tmp_path / "gqa")] == ["attention"]


@pytest.mark.parametrize("L", [20, 33])  # the row-major and the key-major score tile
@pytest.mark.parametrize("kind", ["additive", "bool", "bool_row_masked", "additive_bcast_heads"])
def test_attention_masks(kind, L):
    B, H, S, D = 2, 4, 45, 32
    q, k, v = _qkv(B, H, H, L, S, D)
    if kind == "additive":
        m = torch.randn(B, H, L, S)
    elif kind == "additive_bcast_heads":
        m = torch.where(torch.rand(B, 1, 1, S) > 0.3, 0.0, -math.inf)
        m[..., 0] = 0.0
    else:
        m = torch.rand(B, 1, L, S) > 0.4
        m[..., 0] = True
        if kind == "bool_row_masked":
            m[:, :, 5] = False  # every key masked for row 5: SDPA returns zeros there
    st = _run(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.2), (q, k, v, m))
    assert st.get("attention_fused", 0) == 1


class HFStyleAttention(torch.nn.Module):
    """Written out as HF's eager attention does it: q @ k^T * scale + mask, softmax, dropout, @ v."""

    def __init__(self, dim=64, heads=4, kv_heads=2):
        super().__init__()
        self.h, self.kvh, self.d = heads, kv_heads, dim // heads
        self.q = torch.nn.Linear(dim, dim)
        self.k = torch.nn.Linear(dim, kv_heads * self.d)
        self.v = torch.nn.Linear(dim, kv_heads * self.d)
        self.o = torch.nn.Linear(dim, dim)
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, x, mask):
        B, L, _ = x.shape
        q = self.q(x).view(B, L, self.h, self.d).transpose(1, 2)
        k = self.k(x).view(B, L, self.kvh, self.d).transpose(1, 2)
        v = self.v(x).view(B, L, self.kvh, self.d).transpose(1, 2)
        rep = self.h // self.kvh
        k = k[:, :, None].expand(B, self.kvh, rep, L, self.d).reshape(B, self.h, L, self.d)
        v = v[:, :, None].expand(B, self.kvh, rep, L, self.d).reshape(B, self.h, L, self.d)
        w = torch.matmul(q, k.transpose(2, 3)) * self.d ** -0.5 + mask
        w = self.drop(torch.softmax(w, dim=-1))
        o = torch.matmul(w, v).transpose(1, 2).reshape(B, L, -1)
        return self.o(o)


def test_written_out_gqa_with_mask_and_eval_dropout(tmp_path):
    """HF's repeat_kv (expand + reshape: a copy of K and V per query head) is undone: the
    attention node reads the shared heads (kv_group 2), no copy is made."""
    m = HFStyleAttention().eval()
    x = torch.randn(2, 19, 64)
    mask = torch.zeros(2, 1, 19, 19)
    mask[1, ..., 15:] = -1e9  # padding of the second sequence
    st = _run(m, (x, mask), dump_dir=str(tmp_path))
    assert st.get("attention_fused", 0) == 1
    graph = next(tmp_path.rglob("*graph_fuse_attention.txt")).read_text()
    att = next(line for line in graph.splitlines() if "= attention(" in line)
    # (Q's copy into heads stays; no copy of the expanded K or V [B, KH, rep, L, D])
    assert "kv_group=2" in att and "float32[2, 2, 2, 19, 16]" not in graph, graph


def test_written_out_cross_attention_timm_style():
    def f(q, k, v):  # timm: q scaled first, then q @ k^T, softmax, @ v
        q = q * q.shape[-1] ** -0.5
        return (q @ k.transpose(-2, -1)).softmax(dim=-1) @ v
    st = _run(f, _qkv(2, 6, 6, 50, 197, 64))
    assert st.get("attention_fused", 0) == 1


def test_attention_weights_returned_are_not_fused():
    def f(q, k, v):
        p = torch.softmax(q @ k.transpose(-2, -1), -1)
        return p @ v, p
    st = _run(f, _qkv(1, 2, 2, 9, 11, 8))
    assert st.get("attention_fused", 0) == 0


def test_fuse_attention_option_off_matches():
    st = _run(_sdpa(True), _qkv(1, 2, 2, 40, 40, 16), fuse_attention=False)
    assert st.get("attention_fused", 0) == 0


def test_fully_masked_rows_of_a_plain_softmax_are_nan_like_eager():
    def f(q, k, v, m):
        return torch.softmax(q @ k.transpose(-2, -1) + m, -1) @ v
    q, k, v = _qkv(1, 1, 1, 4, 6, 8)
    m = torch.zeros(1, 1, 4, 6)
    m[..., 2, :] = -math.inf
    with torch.no_grad():
        out = torch.compile(f, backend="polytile", options={"fallback": False})(q, k, v, m)
        ref = f(q, k, v, m)
    assert polytile.stats().get("attention_fused", 0) == 1
    assert torch.isnan(out[..., 2, :]).all() and torch.isnan(ref[..., 2, :]).all()
    keep = [0, 1, 3]
    torch.testing.assert_close(out[..., keep, :], ref[..., keep, :], rtol=1e-4, atol=1e-5)


def test_causal_offset_of_constant_masks():
    b = GraphBuilder()
    L, S = 5, 8
    rows = b.reshape(b.iota(L, "int64"), [L, 1])
    cols = b.reshape(b.iota(S, "int64"), [1, S])
    keep = b.ew("le", b.ew("sub", cols, rows), b.full(3, "int64"))  # j <= i + 3
    assert causal_offset(keep, "keep", -math.inf) == 3
    add = b.where(keep, 0.0, float("-inf"))
    assert causal_offset(add, "add") == 3
    assert causal_offset(b.where(keep, 0.0, -1.0), "add") is None  # not a -inf mask
    band = b.ew("logical_and", keep, b.ew("ge", b.ew("sub", cols, rows), b.full(0, "int64")))
    assert causal_offset(band, "keep", -math.inf) is None  # a band, not causal
    x = b.input(0, [L, S], "float32")
    assert causal_offset(b.ew("gt", x, b.full(0.0, "float32")), "keep", -math.inf) is None  # not constant


def test_rewrite_leaves_other_matmuls_alone():
    b = GraphBuilder()
    x, w = b.input(0, [4, 8], "float32"), b.input(1, [8, 3], "float32")
    g = b.graph([b.node("identity", (b.matmul(x, w),))])
    assert fuse_attention(g) is g


def _prelude_lib(tmp_path, body: str):
    import ctypes
    import subprocess

    from polytile.codegen.c import FMA_ATTRIBUTE, PRELUDE
    from polytile.options import Options

    src = tmp_path / "t.c"
    src.write_text(PRELUDE + body)
    so = tmp_path / "t.so"
    subprocess.run([Options().cc, *Options().cflags, "-std=gnu11", "-shared", "-fPIC", "-fno-math-errno", str(src),
                    "-o", str(so), "-lm"], check=True)
    return ctypes.CDLL(str(so))


@pytest.mark.parametrize("fn", ["exp", "exp2"])
@pytest.mark.parametrize("lanes", [4, 8, 16])
def test_vector_exp_of_the_renderer(tmp_path, lanes, fn):
    """pt_exp and pt_exp2 (the attention kernel's base-2 softmax) against float64."""
    import ctypes

    body = f"""
void vexp(const float* x, float* y, long n) {{
  for (long i = 0; i < n; i += {lanes}) *(pt_f32x{lanes}*)&y[i] = pt_{fn}_f32x{lanes}(*(const pt_f32x{lanes}*)&x[i]);
}}
"""
    lib = _prelude_lib(tmp_path, body)
    x = torch.cat([torch.linspace(-100, 100, 4096 * 4), torch.randn(1024) * 5,
                   torch.tensor([-math.inf, math.inf, math.nan, 0.0, -0.0, -87.0, 88.0, -88.5])])
    if fn == "exp2":  # the same range of results: 2^x for x = the exponent e^x would have
        x = x * 1.4426950408889634
    x = torch.cat([x, torch.zeros((-x.numel()) % lanes)])
    y = torch.empty_like(x)
    ptr = ctypes.c_void_p
    lib.vexp(ptr(x.data_ptr()), ptr(y.data_ptr()), ctypes.c_long(x.numel()))
    ref = torch.exp(x.double()) if fn == "exp" else torch.exp2(x.double())
    normal = (ref > 1e-37) & (ref < 3e38)
    rel = ((y.double() - ref).abs() / ref)[normal]
    assert rel.max() < 5e-7, rel.max()
    assert torch.equal(torch.isnan(y), torch.isnan(x))
    assert (y[x == -math.inf] == 0).all() and (y[x == math.inf] == math.inf).all()
    # below the normal range: 0 (portable form) or libm's denormal (AVX-512 vscalefps), never more
    tiny = (x < -87.33) & ~torch.isnan(x)
    assert ((y[tiny] >= 0) & (y[tiny].double() <= ref[tiny] * (1 + 1e-6) + 1e-44)).all()


def test_constant_evaluation_of_deep_graphs_neither_recurses_nor_guesses():
    """A mask behind thousands of ops (XLNet's attention terms) must not hit Python's recursion
    limit: evaluation gives up (None), the rewrite goes on without the causal shortcut."""
    from polytile.graph.const_eval import evaluate

    b = GraphBuilder()
    x = b.input(0, [4, 4], "float32")
    c0 = b.full(1.0, "float32", (4, 4))
    deep_in, deep_const = x, c0
    for _ in range(3000):
        deep_in = b.ew("add", deep_in, b.full(1.0, "float32"))
        deep_const = b.ew("add", deep_const, b.full(1.0, "float32"))
    assert evaluate(deep_in) is None  # reads an input
    assert evaluate(deep_const) is None  # too deep to be an index mask
    small = b.ew("add", c0, b.full(2.0, "float32"))
    assert (evaluate(small) == 3.0).all()


def test_register_tile_vectors_stay_in_registers(tmp_path):
    """The y vectors of the score and output register tiles are pinned (PT_REG): gcc otherwise
    folds their loads into every FMA, a 512-bit load per FMA that the load port cannot keep up
    with. The pinned tile's assembly has no FMA that takes a whole vector from memory."""
    import platform
    import re
    import subprocess

    from polytile.codegen.c import FMA_ATTRIBUTE, PRELUDE
    from polytile.options import Options

    _run(_sdpa(False), _qkv(1, 2, 2, 64, 64, 32), dump_dir=str(tmp_path / "k"))
    main = _attention_kernel(tmp_path / "k")
    assert main.count(" = PT_REG") >= 2 * 2  # score tile (Q^T) and output tile (V) vectors
    if platform.machine() != "x86_64":
        pytest.skip("the assembly check is for x86-64")
    w = 16 if " avx512f" in open("/proc/cpuinfo").read() else 8
    ys = "".join(f"    pt_f32x{w} y{k} = PT_REG{w}(*(const pt_f32x{w}*)&b[d * {4 * w} + {k * w}]);\n" for k in range(4))
    fmas = "".join(f"    {{ float x = a[(r0 + {i}) * n + d];\n" + "".join(
        f"      c{i}{k} += ((pt_f32x{w}){{}} + x) * y{k};\n" for k in range(4)) + "    }\n" for i in range(4))
    accs = ", ".join(f"c{i}{k} = {{}}" for i in range(4) for k in range(4))
    stores = "".join(f"  *(pt_f32x{w}*)&c[{(4 * i + k) * w}] = c{i}{k};\n" for i in range(4) for k in range(4))
    body = (f"__attribute__(({FMA_ATTRIBUTE})) void tile(const float* restrict a, const float* restrict b, float* restrict c, long n, long r0) {{\n"
            f"  pt_f32x{w} {accs};\n  for (long d = 0; d < n; ++d) {{\n{ys}{fmas}  }}\n{stores}}}\n")
    src = tmp_path / "tile.c"
    src.write_text(PRELUDE + body)
    asm = tmp_path / "tile.s"
    subprocess.run([Options().cc, *Options().cflags, "-std=gnu11", "-S", str(src), "-o", str(asm)], check=True)
    fma = [ln for ln in asm.read_text().splitlines() if "vfmadd" in ln]
    assert len(fma) >= 16
    assert not [ln for ln in fma if "(" in ln and "{1to" not in ln], "an FMA reads its vector from memory"


@pytest.mark.parametrize("L,S,D,Dv,causal,mask", [(1, 1024, 64, 64, False, None), (1, 333, 32, 32, True, None),
                                                  (3, 77, 64, 40, False, "bool"), (4, 1, 16, 16, False, "add"),
                                                  (2, 130, 128, 128, True, None)])
def test_decoding_steps_read_k_and_v_in_place(L, S, D, Dv, causal, mask, tmp_path):
    """A few query rows (a decoding step): the scores are dot products of K's rows read in place
    (``dot_scores``), V is read in place when its rows are whole vectors: no pack kernel, which
    would write K and V once for one use of each key. Partial key tiles, masks, causal, a V
    that is packed (Dv = 40); against eager."""
    q, k, v = torch.randn(1, 4, L, D), torch.randn(1, 4, S, D), torch.randn(1, 4, S, Dv)
    m = None if mask is None else (torch.rand(1, 1, L, S) > 0.3 if mask == "bool" else torch.randn(1, 1, L, S))

    def fn(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal)

    st = _run(fn, (q, k, v, m), dump_dir=str(tmp_path))
    assert st["attention_fused"] == 1
    src = next(tmp_path.rglob("*kernel.c")).read_text()
    entry = src[src.index("int pt_entry("):src.index("int pt_refresh(")]
    # (the pinned machine's vectors: 16 lanes; a pack may be fused into the attention kernel,
    # the entry point's comment names it)
    assert ("pack K, V" in entry) == (Dv % 16 != 0), entry


def test_key_and_value_epilogues_fuse_into_their_projections(tmp_path):
    """A transformer's attention over linear projections with a bias: the attention kernel reads
    K (each element once per block of queries) into register tiles, so K's bias is added by its
    matmul's epilogue, not recomputed inside the attention; Q, read once, may be. (A boolean
    mask's conversion still fuses into the attention: see test_gpu's flash kernels.)"""
    torch.manual_seed(0)
    x = torch.randn(1, 128, 768)
    ws = [torch.randn(768, 768) / 28 for _ in range(3)]
    bs = [torch.randn(768) for _ in range(3)]

    def fn(x, wq, wk, wv, bq, bk, bv):
        def heads(t):
            return t.view(1, 128, 12, 64).transpose(1, 2)
        return F.scaled_dot_product_attention(heads(x @ wq + bq), heads(x @ wk + bk), heads(x @ wv + bv))

    _run(fn, (x, *ws, *bs), dump_dir=str(tmp_path))
    src = next(tmp_path.rglob("*kernel.c")).read_text()
    head = src[:src.index("_attention(int pt_nthreads")]
    origin = head[head.rindex("/*"):]
    assert "attention[" in origin and origin.count("add[") <= 1, origin
