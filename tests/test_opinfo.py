"""Op conformance against PyTorch's OpInfo database (``common_methods_invocations.op_db``).

SELECTION (float32, CPU). An OpInfo is *lowered* when every ATen op its samples produce has a
rule in polytile's lowering table. Mechanically (``select_opinfos``, run it with
``python tests/test_opinfo.py --select``): for each OpInfo of ``op_db`` that supports float32 on
CPU, every sample of ``sample_inputs("cpu", torch.float32)`` (RNG seeded with 0) is traced with
AOTAutograd (``aot_function`` under ``no_grad``, decompositions
``polytile.frontend.torch.backend.decompositions()``: the graph polytile is handed, without
dynamo). The OpInfo is selected when

* every call_function target of every traced graph (``operator.getitem`` aside) is a key of
  ``LOWERINGS``, and
* at least one sample produces at least one ATen op (an OpInfo that is pure Python / metadata
  leaves nothing to lower).

A sample whose eager call raises is ignored by the selection (the test skips it, counted and with
its reason). A sample that runs in eager but cannot be traced excludes its OpInfo. The result is
frozen in ``SELECTED`` ((name, variant_test_name) -> number of samples) so that collection does not
trace ~18k samples; the slow test ``test_selection_is_current`` recomputes it and fails on any
drift (a new rule, a torch upgrade), printing the table to paste.

THE TEST. Each sample runs ``opinfo.op(sample.input, *sample.args, **sample.kwargs)`` through
``torch.compile(fn, backend="polytile", dynamic=False)`` under ``no_grad``, after
``torch._dynamo.reset()`` and ``polytile.reset_stats()``, and must

* match eager (run first, on a deep copy of the sample) by the accuracy rule of tests/accuracy.py
  at tol 1e-4 (exact for int/bool outputs; dtype and shape must match; float64 reference on
  demand). Ops whose output is uninitialized memory (``UNINITIALIZED``: empty, empty_like ...)
  compare dtype and shape only (no op's strides are compared: the accuracy rule ignores them);
* compile natively: ``ops_fallen_back == {}``, ``graphs_failed == 0``, and no dynamo graph break
  (ops dynamo leaves to Python would bypass polytile without being counted as a fallback). A
  sample that reaches polytile with no graph at all (dynamo found no tensor op to compile, e.g. a
  reshape to the same shape) passes and is counted as "nothing to compile" in the summary.

A sample whose eager call raises is skipped with the eager error as the reason; the summary
counts and prints those reasons. Known failures are listed in ``KNOWN_FAILURES`` and applied as
strict xfails (an XPASS fails the run: remove the entry when the bug is fixed).

DEFAULT vs SLOW. ``test_opinfo`` (default run) covers the first ``DEFAULT_SAMPLES`` samples of
every selected OpInfo; ``test_opinfo_exhaustive`` (``-m slow``) covers every sample. A summary
(OpInfos selected / passing, samples run / passing, eager skips, known failures hit) is printed at
the end of the session by the ``pytest_terminal_summary`` hook in tests/conftest.py.

MEASURED (2-core shared machine, torch 2.14.1, warm kernel cache):

* selection: 703 OpInfos in op_db, 678 with float32 on CPU, 411 selected (11502 samples);
  recomputing it takes ~10 min (more on a loaded host).
* default run (``pytest tests/test_opinfo.py``): the 411 selected OpInfos, 788 samples: 765 pass
  (10 of them with nothing to compile), 23 known failures; plus the first sample of every other
  OpInfo (``test_other_opinfo_first_sample``, fallbacks allowed), 88 s for the selected part.
* slow run (``pytest -m slow tests/test_opinfo.py``): every sample of the selected OpInfos and of
  the others, plus test_selection_is_current.
"""
from __future__ import annotations

import copy
import functools
import logging
import operator
import sys
import warnings
from typing import Any

import pytest
import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

import polytile
from accuracy import assert_accurate, fp64_reference  # tests/accuracy.py: the DESIGN.md section 4 rule
from polytile.frontend.torch.backend import decompositions
from polytile.frontend.torch.registry import LOWERINGS, ensure_loaded

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torch.testing._internal.common_methods_invocations import op_db  # needs `expecttest`

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # eager's own warnings about the samples

TOL = 1e-4
DTYPE = torch.float32
DEFAULT_SAMPLES = 2  # per selected OpInfo in the default run
HALF_TOL = 1e-2  # (the accuracy rule's floor for bfloat16/float16 results, as tests/test_low_precision.py)
SEED = 0  # torch.manual_seed before generating an OpInfo's samples (they are random)

# Ops whose result is uninitialized memory: only dtype and shape are compared (strides are not
# part of the accuracy rule for any op; polytile's outputs are contiguous).
UNINITIALIZED = {("empty", ""), ("empty_like", ""), ("new_empty", ""), ("empty_strided", ""),
                 ("empty_permuted", "")}

# ------------------------------------------------------------------------------ the selection
# Generated by `python tests/test_opinfo.py --select`; checked by test_selection_is_current (slow).
SELECTED: dict[tuple[str, str], int] = {
    ('abs', ''): 1,
    ('acos', ''): 3,
    ('add', ''): 11,
    ('arange', ''): 27,
    ('clamp_max', ''): 9,
    ('clamp_min', ''): 9,
    ('mul', ''): 9,
    ('sub', ''): 11,
    ('addmm', ''): 6,
    ('addmm', 'decomposed'): 6,
    ('baddbmm', ''): 7,
    ('dot', ''): 1,
    ('vdot', ''): 1,
    ('bmm', ''): 1,
    ('mv', ''): 1,
    ('addr', ''): 6,
    ('addcmul', ''): 12,
    ('addcdiv', ''): 12,
    ('asin', ''): 1,
    ('atan', ''): 1,
    ('atan2', ''): 9,
    ('broadcast_to', ''): 7,
    ('broadcast_tensors', ''): 1,
    ('block_diag', ''): 4,
    ('cartesian_prod', ''): 3,
    ('ceil', ''): 1,
    ('chunk', ''): 3,
    ('unsafe_chunk', ''): 3,
    ('clone', ''): 2,
    ('sum_to_size', ''): 16,
    ('clamp', ''): 7,
    ('cos', ''): 3,
    ('cosh', ''): 3,
    ('cross', ''): 3,
    ('cumsum', ''): 4,
    ('cumprod', ''): 10,
    ('deg2rad', ''): 1,
    ('diff', ''): 64,
    ('div', 'no_rounding_mode'): 9,
    ('div', 'trunc_rounding'): 9,
    ('div', 'floor_rounding'): 9,
    ('true_divide', ''): 9,
    ('exp', ''): 3,
    ('expand', ''): 9,
    ('expand_as', ''): 3,
    ('expand_copy', ''): 9,
    ('diag_embed', ''): 15,
    ('alias_copy', ''): 2,
    ('eq', ''): 10,
    ('fmod', ''): 9,
    ('remainder', ''): 9,
    ('frac', ''): 1,
    ('floor', ''): 1,
    ('flip', ''): 10,
    ('fliplr', ''): 2,
    ('flipud', ''): 2,
    ('floor_divide', ''): 9,
    ('log1p', ''): 1,
    ('ge', ''): 9,
    ('gt', ''): 9,
    ('gradient', ''): 8,
    ('le', ''): 9,
    ('linspace', ''): 62,
    ('linspace', 'tensor_overload'): 182,
    ('logspace', ''): 401,
    ('logspace', 'tensor_overload'): 1201,
    ('log', ''): 3,
    ('log10', ''): 3,
    ('log2', ''): 3,
    ('logaddexp', ''): 9,
    ('logaddexp2', ''): 1,
    ('logical_not', ''): 3,
    ('lt', ''): 9,
    ('masked_fill', ''): 8,
    ('matmul', ''): 15,
    ('max', 'reduction_with_dim'): 4,
    ('max', 'reduction_no_dim'): 2,
    ('var_mean', ''): 17,
    ('var_mean', 'unbiased'): 4,
    ('std_mean', ''): 17,
    ('std_mean', 'unbiased'): 4,
    ('meshgrid', 'variadic_tensors'): 10,
    ('meshgrid', 'list_of_tensors'): 10,
    ('min', 'reduction_with_dim'): 4,
    ('min', 'reduction_no_dim'): 2,
    ('max', 'binary'): 9,
    ('maximum', ''): 9,
    ('min', 'binary'): 9,
    ('minimum', ''): 9,
    ('logical_and', ''): 9,
    ('logical_or', ''): 9,
    ('logical_xor', ''): 9,
    ('heaviside', ''): 9,
    ('isclose', ''): 17,
    ('softmax', ''): 7,
    ('softmax', 'with_dtype'): 7,
    ('_softmax_backward_data', ''): 3,
    ('nn.functional.softmin', ''): 7,
    ('nn.functional.softmin', 'with_dtype'): 7,
    ('nn.functional.cross_entropy', ''): 21,
    ('nn.functional.linear_cross_entropy', ''): 119,
    ('nn.functional.normalize', ''): 8,
    ('aminmax', ''): 7,
    ('as_strided', ''): 5,
    ('as_strided', 'partial_views'): 3,
    ('native_group_norm', ''): 25,
    ('native_layer_norm', ''): 20,
    ('native_batch_norm', ''): 10,
    ('_native_batch_norm_legit', ''): 10,
    ('nn.functional.cosine_similarity', ''): 9,
    ('nn.functional.adaptive_avg_pool1d', ''): 6,
    ('nn.functional.adaptive_avg_pool2d', ''): 10,
    ('nn.functional.adaptive_max_pool1d', ''): 12,
    ('nn.functional.adaptive_max_pool2d', ''): 34,
    ('nn.functional.avg_pool1d', ''): 9,
    ('nn.functional.binary_cross_entropy_with_logits', ''): 26,
    ('nn.functional.relu', ''): 4,
    ('nn.functional.conv_transpose1d', ''): 10,
    ('nn.functional.conv_transpose2d', ''): 12,
    ('nn.functional.conv_transpose3d', ''): 10,
    ('nn.functional.conv1d', ''): 10,
    ('nn.functional.conv2d', ''): 30,
    ('nn.functional.conv3d', ''): 20,
    ('nn.functional.group_norm', ''): 25,
    ('nn.functional.instance_norm', ''): 9,
    ('nn.functional.layer_norm', ''): 6,
    ('nn.functional.rms_norm', ''): 6,
    ('nn.functional.local_response_norm', ''): 11,
    ('constant_pad_nd', ''): 51,
    ('nn.functional.pad', 'constant'): 51,
    ('nn.functional.pad', 'reflect'): 12,
    ('nn.functional.pad', 'replicate'): 12,
    ('nn.functional.pad', 'replicate_negative'): 6,
    ('nn.functional.pad', 'circular'): 8,
    ('nn.functional.hardswish', ''): 4,
    ('nn.functional.unfold', ''): 163,
    ('nn.functional.interpolate', 'nearest'): 23,
    ('nn.functional.interpolate', 'nearest-exact'): 23,
    ('nn.functional.interpolate', 'linear'): 18,
    ('nn.functional.interpolate', 'bilinear'): 24,
    ('nn.functional.interpolate', 'bicubic'): 24,
    ('nn.functional.interpolate', 'trilinear'): 24,
    ('nn.functional.upsample_bilinear', ''): 4,
    ('nn.functional.soft_margin_loss', ''): 6,
    ('nn.functional.upsample_nearest', ''): 12,
    ('nn.functional.margin_ranking_loss', ''): 24,
    ('nn.functional.multi_margin_loss', ''): 10,
    ('nn.functional.multilabel_margin_loss', ''): 7,
    ('nn.functional.leaky_relu', ''): 9,
    ('nn.functional.multilabel_soft_margin_loss', ''): 4,
    ('nn.functional.avg_pool2d', ''): 7,
    ('nn.functional.max_pool1d', ''): 864,
    ('nn.functional.max_pool2d', ''): 1440,
    ('max_pool2d_with_indices_backward', ''): 1440,
    ('nn.functional.max_unpool1d', ''): 144,
    ('nn.functional.max_unpool1d', 'grad'): 13,
    ('nn.functional.max_unpool2d', ''): 288,
    ('nn.functional.max_unpool2d', 'grad'): 33,
    ('nn.functional.max_unpool3d', ''): 96,
    ('nn.functional.max_unpool3d', 'grad'): 12,
    ('nn.functional.linear', ''): 20,
    ('nn.functional.glu', ''): 46,
    ('nn.functional.elu', ''): 3,
    ('nn.functional.prelu', ''): 25,
    ('nn.functional.celu', ''): 3,
    ('nn.functional.selu', ''): 3,
    ('torch.ops.aten._safe_softmax.default', ''): 8,
    ('torch.ops.aten._scaled_dot_product_flash_attention_for_cpu', ''): 3,
    ('nn.functional.silu', ''): 3,
    ('nn.functional.hardsigmoid', ''): 3,
    ('nn.functional.logsigmoid', ''): 3,
    ('nn.functional.mish', ''): 3,
    ('nn.functional.softsign', ''): 3,
    ('nn.functional.tanhshrink', ''): 3,
    ('nn.functional.threshold', ''): 4,
    ('nn.functional.triplet_margin_loss', ''): 7,
    ('nn.functional.triplet_margin_with_distance_loss', ''): 7,
    ('to', ''): 24,
    ('nn.functional.batch_norm', ''): 12,
    ('nn.functional.binary_cross_entropy', ''): 11,
    ('nn.functional.softshrink', ''): 5,
    ('nn.functional.hardshrink', ''): 6,
    ('nn.functional.hardtanh', ''): 5,
    ('nn.functional.gelu', ''): 8,
    ('nn.functional.relu6', ''): 3,
    ('mm', ''): 3,
    ('ne', ''): 9,
    ('neg', ''): 1,
    ('outer', ''): 1,
    ('permute', ''): 4,
    ('pow', ''): 9,
    ('float_power', ''): 9,
    ('rad2deg', ''): 1,
    ('roll', ''): 17,
    ('rot90', ''): 34,
    ('round', ''): 1,
    ('round', 'decimals_0'): 3,
    ('round', 'decimals_3'): 3,
    ('round', 'decimals_neg_3'): 3,
    ('sin', ''): 1,
    ('sinc', ''): 3,
    ('sinh', ''): 1,
    ('sign', ''): 1,
    ('sgn', ''): 1,
    ('split', ''): 2,
    ('split', 'list_args'): 3,
    ('unsafe_split', ''): 2,
    ('split_with_sizes', ''): 4,
    ('split_with_sizes_copy', ''): 4,
    ('__radd__', ''): 9,
    ('__rdiv__', ''): 9,
    ('__rmul__', ''): 9,
    ('__rmatmul__', ''): 15,
    ('__rmod__', ''): 9,
    ('__rpow__', ''): 9,
    ('__rsub__', ''): 9,
    ('rsub', ''): 11,
    ('select', ''): 6,
    ('select_scatter', ''): 5,
    ('slice', ''): 4,
    ('slice_scatter', ''): 9,
    ('tan', ''): 1,
    ('tanh', ''): 1,
    ('hsplit', ''): 2,
    ('vsplit', ''): 2,
    ('dsplit', ''): 2,
    ('trunc', ''): 1,
    ('exp2', ''): 3,
    ('expm1', ''): 1,
    ('nan_to_num', ''): 3,
    ('reciprocal', ''): 3,
    ('rsqrt', ''): 3,
    ('sqrt', ''): 1,
    ('square', ''): 3,
    ('lerp', ''): 14,
    ('isfinite', ''): 3,
    ('isinf', ''): 1,
    ('isposinf', ''): 1,
    ('isneginf', ''): 1,
    ('isreal', ''): 3,
    ('isnan', ''): 1,
    ('ravel', ''): 3,
    ('reshape', ''): 7,
    ('reshape_as', ''): 4,
    ('view', ''): 7,
    ('view_as', ''): 4,
    ('atleast_1d', ''): 6,
    ('atleast_2d', ''): 6,
    ('atleast_3d', ''): 6,
    ('flatten', ''): 6,
    ('unflatten', ''): 10,
    ('column_stack', ''): 3,
    ('gather', ''): 7,
    ('index_fill', ''): 6,
    ('index_copy', ''): 3,
    ('index_select', ''): 3,
    ('index_add', ''): 9,
    ('_unsafe_masked_index', ''): 6,
    ('_unsafe_masked_index_put_accumulate', ''): 6,
    ('index_put', ''): 4,
    ('bfloat16', ''): 5,
    ('bool', ''): 5,
    ('byte', ''): 5,
    ('char', ''): 5,
    ('double', ''): 5,
    ('float', ''): 5,
    ('half', ''): 5,
    ('int', ''): 5,
    ('long', ''): 5,
    ('short', ''): 5,
    ('cdouble', ''): 5,
    ('cfloat', ''): 5,
    ('chalf', ''): 5,
    ('empty_like', ''): 7,
    ('zeros_like', ''): 7,
    ('ones_like', ''): 7,
    ('full_like', ''): 7,
    ('new_zeros', ''): 7,
    ('new_ones', ''): 7,
    ('ones', ''): 2,
    ('zeros', ''): 2,
    ('full', ''): 4,
    ('new_empty', ''): 7,
    ('empty_strided', ''): 4,
    ('empty', ''): 6,
    ('eye', ''): 90,
    ('empty_permuted', ''): 39,
    ('scalar_tensor', ''): 3,
    ('new_full', ''): 7,
    ('scatter_add', ''): 7,
    ('stack', ''): 9,
    ('_chunk_cat', ''): 8,
    ('hstack', ''): 2,
    ('cat', ''): 9,
    ('unbind', ''): 6,
    ('vstack', ''): 2,
    ('dstack', ''): 2,
    ('unfold', ''): 22,
    ('unfold_copy', ''): 22,
    ('movedim', ''): 2,
    ('renorm', ''): 4,
    ('repeat', ''): 40,
    ('squeeze', ''): 8,
    ('squeeze', 'multiple'): 6,
    ('squeeze_copy', ''): 8,
    ('fill', ''): 3,
    ('resize_', ''): 3,
    ('take_along_dim', ''): 5,
    ('tile', ''): 54,
    ('trapz', ''): 9,
    ('trapezoid', ''): 9,
    ('cumulative_trapezoid', ''): 9,
    ('unsqueeze', ''): 9,
    ('unsqueeze_copy', ''): 9,
    ('xlogy', ''): 9,
    ('zero_', ''): 3,
    ('logsumexp', ''): 15,
    ('transpose', ''): 8,
    ('transpose_copy', ''): 8,
    ('T', ''): 2,
    ('H', ''): 2,
    ('mT', ''): 5,
    ('mH', ''): 5,
    ('tril', ''): 8,
    ('triu', ''): 8,
    ('kron', ''): 1,
    ('inner', ''): 2,
    ('tensordot', ''): 3,
    ('sigmoid', ''): 3,
    ('erf', ''): 1,
    ('erfinv', ''): 1,
    ('nn.functional.smooth_l1_loss', ''): 8,
    ('nn.functional.l1_loss', ''): 6,
    ('log_softmax', ''): 7,
    ('log_softmax', 'with_dtype'): 7,
    ('logit', ''): 5,
    ('where', ''): 6,
    ('norm', ''): 42,
    ('norm', 'fro'): 3,
    ('norm', 'inf'): 4,
    ('t', ''): 3,
    ('t_copy', ''): 3,
    ('native_dropout_backward', ''): 9,
    ('nn.functional.softplus', ''): 3,
    ('nn.functional.mse_loss', ''): 6,
    ('all', ''): 20,
    ('any', ''): 20,
    ('amax', ''): 20,
    ('amin', ''): 20,
    ('argmax', ''): 13,
    ('argmin', ''): 13,
    ('count_nonzero', ''): 20,
    ('mean', ''): 20,
    ('nanmean', ''): 35,
    ('std', ''): 17,
    ('std', 'unbiased'): 4,
    ('var', ''): 17,
    ('var', 'unbiased'): 4,
    ('prod', ''): 39,
    ('sum', ''): 20,
    ('nansum', ''): 35,
    ('nn.functional.cosine_embedding_loss', ''): 6,
    ('nn.functional.nll_loss', ''): 61,
    ('nn.functional.hinge_embedding_loss', ''): 10,
    ('nn.functional.huber_loss', ''): 9,
    ('nn.functional.poisson_nll_loss', ''): 72,
    ('nn.functional.pairwise_distance', ''): 7,
    ('nn.functional.pixel_shuffle', ''): 5,
    ('nn.functional.pixel_unshuffle', ''): 5,
    ('nn.functional.channel_shuffle', ''): 3,
    ('nn.functional.kl_div', ''): 16,
    ('diagflat', ''): 5,
    ('fft.fftshift', ''): 5,
    ('fft.ifftshift', ''): 5,
    ('linalg.cross', ''): 3,
    ('linalg.vecdot', ''): 44,
    ('linalg.multi_dot', ''): 7,
    ('linalg.vander', ''): 10,
    ('linalg.vector_norm', ''): 180,
    ('signal.windows.hamming', ''): 12,
    ('signal.windows.hann', ''): 12,
    ('signal.windows.bartlett', ''): 12,
    ('signal.windows.blackman', ''): 12,
    ('signal.windows.cosine', ''): 12,
    ('signal.windows.exponential', ''): 12,
    ('signal.windows.gaussian', ''): 12,
    ('signal.windows.general_cosine', ''): 12,
    ('signal.windows.general_hamming', ''): 12,
    ('signal.windows.nuttall', ''): 12,
    ('special.ndtr', ''): 3,
    ('special.xlog1py', ''): 9,
    ('special.entr', ''): 2,
    ('masked.sum', ''): 90,
    ('masked.prod', ''): 90,
    ('masked.cumsum', ''): 17,
    ('masked.cumprod', ''): 17,
    ('masked.amax', ''): 90,
    ('masked.amin', ''): 90,
    ('masked.argmax', ''): 55,
    ('masked.argmin', ''): 55,
    ('masked.mean', ''): 90,
    ('masked.norm', ''): 450,
    ('masked.var', ''): 58,
    ('masked.std', ''): 58,
    ('masked.softmax', ''): 24,
    ('masked.log_softmax', ''): 24,
    ('masked.softmin', ''): 24,
    ('masked.normalize', ''): 30,
    ('masked.logaddexp', ''): 11,
    ('masked.logsumexp', ''): 90,
    ('bmm', 'triton_optimized'): 18,
}

# ------------------------------------------------------------------------------ known failures
# (opinfo name, variant_test_name) -> reason (every sample of that OpInfo fails),
#                                  or {sample index: reason} (only those samples fail).
_ADAPTIVE_MAX = ("the adaptive_max_pool2d rule handles only input sizes divisible by the output size "
                 "(uneven, overlapping windows are refused and ATen runs the op)")
_TRANSPOSED = "the convolution rule refuses 3-d (transposed) convolution (aten.convolution runs in ATen)"
_DTYPE = "polytile has no {} dtype: the _to_copy rule refuses (README: no complex dtypes)"
KNOWN_FAILURES: dict[tuple[str, str], str | dict[int, str]] = {
    ("as_strided", "partial_views"): {
        1: "by design: storage_offset=0 on a view starting at storage offset 5 addresses storage before the "
           "input's first element, which the compiled graph does not receive; the rule refuses and ATen runs it "
           "(test_ops.py::test_as_strided_before_its_input_falls_back)"},
    ("nn.functional.adaptive_max_pool1d", ""): dict.fromkeys([0, 1, 2, 3, 8, 9, 10, 11], _ADAPTIVE_MAX),
    ("nn.functional.adaptive_max_pool2d", ""): dict.fromkeys(
        [0, 1, 2, 3, 4, 5, 6, 7, 12, 13, 14, 15, *range(20, 34)], _ADAPTIVE_MAX),
    ("nn.functional.conv_transpose3d", ""): _TRANSPOSED,
    ("nn.functional.conv3d", ""): "the convolution rule refuses 3-d convolution (aten.convolution runs in ATen)",
    ("cdouble", ""): _DTYPE.format("complex128"),
    ("cfloat", ""): _DTYPE.format("complex64"),
    ("chalf", ""): _DTYPE.format("complex32"),
    ("empty_strided", ""): "dynamo graph break, not polytile: the OpInfo's op is wrapper_set_seed(torch.empty_strided, ...) "
                           "and dynamo cannot trace torch._C._DisableFuncTorch() in freeze_rng_state",
    ("resize_", ""): "dynamo graph break, not polytile: dynamo does not trace Tensor.resize_()",
}


# ------------------------------------------------------------------------------ helpers
OPINFOS = {(o.name, o.variant_test_name): o for o in op_db}


def _label(key: tuple[str, str]) -> str:
    name, variant = key
    return f"{name}.{variant}" if variant else name


@functools.lru_cache(maxsize=4)
def samples_of(key: tuple[str, str], dtype: torch.dtype = DTYPE) -> tuple:
    """The OpInfo's CPU samples in ``dtype`` (float32 by default), generated with a fixed seed
    (tests reuse them read-only: each run works on deep copies)."""
    torch.manual_seed(SEED)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tuple(OPINFOS[key].sample_inputs("cpu", dtype))


def _call(opinfo, sample_args):
    inp, args, kwargs = sample_args
    return opinfo.op(inp, *args, **kwargs)


def _as_args(sample) -> tuple:
    return sample.input, tuple(sample.args), dict(sample.kwargs)


def aten_targets(opinfo, sample) -> set[str]:
    """The call_function targets of the graph(s) AOTAutograd hands a backend for this sample
    (no dynamo: the tensors of the sample become the graph inputs)."""
    from torch._functorch.aot_autograd import aot_function

    leaves, spec = tree_flatten(_as_args(sample))
    pos = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]

    def f(*tensors):
        flat = list(leaves)
        for i, t in zip(pos, tensors):
            flat[i] = t
        return _call(opinfo, tree_unflatten(flat, spec))

    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm

    with torch.no_grad():
        aot_function(f, fw_compiler=capture, decompositions=decompositions())(*[leaves[i] for i in pos])
    return {n.target for g in graphs for n in g.graph.nodes
            if n.op == "call_function" and n.target is not operator.getitem}


def classify(opinfo) -> tuple[bool, str, int]:
    """(lowered, why not, number of samples) for one OpInfo, by the criterion of the docstring."""
    key = (opinfo.name, opinfo.variant_test_name)
    if DTYPE not in opinfo.supported_dtypes("cpu"):
        return False, "no float32 on CPU", 0
    try:
        samples = samples_of(key)
    except Exception as e:
        return False, f"sample_inputs raises {type(e).__name__}", 0
    any_op = False
    for k, s in enumerate(samples):
        try:
            with torch.no_grad():
                _call(opinfo, copy.deepcopy(_as_args(s)))
        except Exception:
            continue  # eager raises: the test skips this sample
        try:
            targets = aten_targets(opinfo, copy.deepcopy(s))
        except Exception as e:
            return False, f"sample {k}: AOT trace raises {type(e).__name__}", len(samples)
        missing = sorted(str(t) for t in targets if t not in LOWERINGS)
        if missing:
            return False, f"sample {k}: no rule for {', '.join(missing)}", len(samples)
        any_op |= bool(targets)
    if not any_op:
        return False, "no sample produces an ATen op (or every sample raises in eager)", len(samples)
    return True, "", len(samples)


def select_opinfos(verbose: bool = False) -> dict[tuple[str, str], int]:
    """The selection of the docstring, recomputed: (name, variant) -> number of samples."""
    ensure_loaded()
    selected = {}
    for o in op_db:
        ok, why, n = classify(o)
        key = (o.name, o.variant_test_name)
        if ok:
            selected[key] = n
        if verbose:
            print(f"# {'SELECTED' if ok else 'excluded'} {_label(key)}: {why or n}", file=sys.stderr, flush=True)
    return selected


# ------------------------------------------------------------------------------ running a sample
def _meta_only(out) -> Any:
    """dtype and shape of every tensor leaf (for uninitialized results; like the accuracy rule,
    this does not compare strides: compiled outputs are contiguous)."""
    leaves, spec = tree_flatten(out)
    return [(x.dtype, tuple(x.shape)) if isinstance(x, torch.Tensor) else x for x in leaves]


def _eager_then_compiled(opinfo, args):
    """(eager's result on a copy of ``args``, polytile's on ``args``), under no_grad, from fresh
    dynamo state and counters; skips the test when eager raises."""
    def fn(inp, *a, **kw):
        return opinfo.op(inp, *a, **kw)

    with torch.no_grad():
        try:
            expected = _call(opinfo, copy.deepcopy(args))
        except Exception as e:
            msg = str(e).strip().splitlines()[0][:160] if str(e).strip() else ""
            pytest.skip(f"eager raises {type(e).__name__}: {msg}")
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        polytile.reset_stats()
        return expected, torch.compile(fn, backend="polytile", dynamic=False)(args[0], *args[1], **args[2])


def run_sample(key: tuple[str, str], index: int, request=None, dtype: torch.dtype = DTYPE) -> None:
    opinfo = OPINFOS[key]
    samples = samples_of(key, dtype)
    if dtype != DTYPE and index >= len(samples):
        pytest.skip(f"{_label(key)} has no {dtype} sample")
    assert index < len(samples), (f"{_label(key)} now has {len(samples)} samples (SELECTED says "
                                  f"{SELECTED.get(key)}): regenerate SELECTED")
    sample = samples[index]
    expected, got = _eager_then_compiled(opinfo, copy.deepcopy(_as_args(sample)))
    st = polytile.stats()
    breaks = dict(torch._dynamo.utils.counters["graph_break"])
    assert st["ops_fallen_back"] == {}, f"fell back to ATen: {st['ops_fallen_back']}"
    assert st["graphs_failed"] == 0, f"a graph failed to compile: {st}"
    assert not breaks, f"dynamo graph break (ops ran outside polytile): {breaks}"
    if request is not None and st["graphs_compiled"] == 0:
        request.node.user_properties.append(("opinfo", "nothing to compile"))

    if key in UNINITIALIZED:
        assert _meta_only(got) == _meta_only(expected)
        return

    def ref64():  # the float64 reference, computed only if some result is not allclose
        try:
            return fp64_reference(lambda inp, a, kw: opinfo.op(inp, *a, **kw), copy.deepcopy(_as_args(sample)))
        except Exception:
            return None

    assert_accurate(got, expected, ref64, TOL if dtype == DTYPE else HALF_TOL)


def _known(key: tuple[str, str], index: int) -> str | None:
    k = KNOWN_FAILURES.get(key)
    if isinstance(k, dict):
        return k.get(index)
    return k


def _params(limit: int | None):
    out = []
    for key, n in SELECTED.items():
        for i in range(n if limit is None else min(n, limit)):
            reason = _known(key, i)
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            out.append(pytest.param(key, i, id=f"{_label(key)}-s{i}", marks=marks))
    return out


@pytest.fixture(autouse=True, scope="module")
def _quiet():
    """polytile logs one warning per fallback op; the assertion already names them."""
    lg = logging.getLogger("polytile")
    old = lg.level
    lg.setLevel(logging.ERROR)
    yield
    lg.setLevel(old)


@pytest.mark.parametrize("key,index", _params(DEFAULT_SAMPLES))
def test_opinfo(key, index, request):
    run_sample(key, index, request)


@pytest.mark.slow
@pytest.mark.parametrize("key,index", _params(None))
def test_opinfo_exhaustive(key, index, request):
    run_sample(key, index, request)


# ------------------------------------------------------------------------------ half precision
# The first sample of every selected OpInfo that supports the type, in bfloat16 and float16
# (slow), and of every HALF_STRIDE-th of them in bfloat16 (default run): compiled
# (``half_types="compile"``, the default) with no fallback and accurate by the rule for low
# precision. HALF_FAILURES: (key, dtype name) -> reason.
HALF_STRIDE = 3
HALF_FAILURES: dict[tuple[tuple[str, str], str], str] = {}


def _half_params(dtype: torch.dtype, stride: int = 1):
    out = []
    for key in list(SELECTED)[::stride]:
        if not OPINFOS[key].supports_dtype(dtype, "cpu") or key in UNINITIALIZED:
            continue
        reason = HALF_FAILURES.get((key, str(dtype)[6:])) or _known(key, 0)
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        out.append(pytest.param(key, id=f"{_label(key)}-{str(dtype)[6:]}", marks=marks))
    return out


@pytest.mark.parametrize("key", _half_params(torch.bfloat16, HALF_STRIDE))
def test_opinfo_bfloat16(key, request):
    run_sample(key, 0, request, torch.bfloat16)


@pytest.mark.slow
@pytest.mark.parametrize("key", _half_params(torch.bfloat16))
def test_opinfo_bfloat16_every_op(key, request):
    run_sample(key, 0, request, torch.bfloat16)


@pytest.mark.slow
@pytest.mark.parametrize("key", _half_params(torch.float16))
def test_opinfo_float16(key, request):
    run_sample(key, 0, request, torch.float16)


# ------------------------------------------------------------------------------ the other OpInfos
# Every other OpInfo with float32 on CPU: polytile lowers part of it or none, and must still give
# eager's result (the rest through ATen), never crash. First sample in the default run, every
# sample under -m slow.
UNSELECTED = sorted(k for k, o in OPINFOS.items() if k not in SELECTED and DTYPE in o.supported_dtypes("cpu"))
# OpInfos whose samples dynamo or eager itself cannot run twice the same way (random results)
RANDOM = {"bernoulli", "multinomial", "normal", "uniform", "nn.functional.dropout", "nn.functional.dropout2d",
          "nn.functional.dropout3d", "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout",
          "nn.functional.rrelu", "randn", "randn_like", "rand_like", "randint", "randint_like", "exponential",
          "geometric", "log_normal", "cauchy", "nn.functional.fractional_max_pool2d",
          "nn.functional.fractional_max_pool3d", "nn.functional.multi_head_attention_forward",
          "nn.functional.scaled_dot_product_attention", "torch._scaled_mm", "empty", "empty_like",
          "new_empty", "empty_permuted", "new_empty_strided"}


def run_any_sample(key: tuple[str, str], index: int) -> None:
    """A sample of an OpInfo polytile may not lower fully: the compiled function, with whatever
    falls back to ATen, gives eager's result (or eager's own error)."""
    opinfo = OPINFOS[key]
    samples = samples_of(key)
    if index >= len(samples):
        pytest.skip("no such sample")
    try:
        args = copy.deepcopy(_as_args(samples[index]))
    except NotImplementedError as e:  # sparse compressed inputs cannot be copied
        pytest.skip(f"sample cannot be copied: {e}")
    expected, got = _eager_then_compiled(opinfo, args)

    def ref64():
        try:
            return fp64_reference(lambda inp, a, kw: opinfo.op(inp, *a, **kw), copy.deepcopy(_as_args(samples[index])))
        except Exception:
            return None

    assert_accurate(got, expected, ref64, TOL)


@pytest.mark.parametrize("key", [k for k in UNSELECTED if k[0] not in RANDOM], ids=_label)
def test_other_opinfo_first_sample(key):
    run_any_sample(key, 0)


@pytest.mark.slow
@pytest.mark.parametrize("key", [k for k in UNSELECTED if k[0] not in RANDOM], ids=_label)
def test_other_opinfo_every_sample(key):
    for i in range(len(samples_of(key))):
        run_any_sample(key, i)


def test_known_failures_are_selected():
    """Every KNOWN_FAILURES entry names a selected OpInfo and existing sample indices."""
    for key, v in KNOWN_FAILURES.items():
        assert key in SELECTED, f"{key} is not a selected OpInfo"
        if isinstance(v, dict):
            assert all(0 <= i < SELECTED[key] for i in v), f"{key}: sample index out of range"


@pytest.mark.slow
def test_selection_is_current():
    """SELECTED is what the criterion of the docstring gives today."""
    now = select_opinfos()
    if now != SELECTED:
        added = sorted(set(now) - set(SELECTED))
        removed = sorted(set(SELECTED) - set(now))
        changed = sorted(k for k in set(now) & set(SELECTED) if now[k] != SELECTED[k])
        pytest.fail(f"SELECTED is stale: added {added}, removed {removed}, sample counts changed {changed}; "
                    f"regenerate with `python tests/test_opinfo.py --select`")


# ------------------------------------------------------------------------------ summary (conftest hook)
def _ranges(idx: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'"""
    out, idx = [], sorted(idx)
    for i in idx:
        if out and out[-1][1] == i - 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in out)


def summary_lines(reports) -> list[str]:
    """The session summary from pytest's reports of this module's sample tests, one block per
    test function (test_opinfo: the default subset; test_opinfo_exhaustive: every sample)."""
    groups: dict = {}
    for rep in reports:
        groups.setdefault(rep.nodeid.split("[", 1)[0].rsplit("::", 1)[-1], []).append(rep)
    lines = []
    for func, reps in groups.items():
        block = _summary_block(reps)
        if block:
            what = "every sample" if func.endswith("exhaustive") else f"first {DEFAULT_SAMPLES} samples per OpInfo"
            lines += [f"{func} ({what}):"] + ["  " + line for line in block]
    return lines


def _summary_block(reports) -> list[str]:
    per_op: dict = {}
    counts = {"passed": 0, "nothing": 0, "xfailed": 0, "failed": 0, "skipped": 0, "xpassed": 0}
    skips: dict = {}
    known_hit: dict = {}  # (opinfo, reason) -> sample indices
    nothing: list = []  # passed without any graph reaching polytile
    by_id = {f"{_label(k)}-s{i}": (k, i) for k, n in SELECTED.items() for i in range(n)}
    for rep in reports:
        pid = rep.nodeid.split("[", 1)[-1].rstrip("]")
        if pid not in by_id:
            continue
        key, idx = by_id[pid]
        xfail = hasattr(rep, "wasxfail")
        if rep.skipped and xfail:
            out = "xfailed"
        elif rep.skipped:
            out = "skipped"
            reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
            skips.setdefault(reason.removeprefix("Skipped: "), []).append(pid)
        elif rep.passed and xfail:
            out = "xpassed"
        elif rep.passed:
            out = "passed"
            if ("opinfo", "nothing to compile") in rep.user_properties:
                counts["nothing"] += 1
                nothing.append(pid)
        else:
            out = "failed"
        counts[out] += 1
        per_op.setdefault(key, []).append(out)
        if out == "xfailed":
            known_hit.setdefault((_label(key), _known(key, idx)), []).append(idx)
    if not per_op:
        return []
    run = sum(v for k, v in counts.items() if k != "nothing")
    ops_pass = sum(1 for outs in per_op.values() if all(o in ("passed", "skipped") for o in outs)
                   and "passed" in outs)
    ops_skipped = sum(1 for outs in per_op.values() if all(o == "skipped" for o in outs))
    lines = [
        f"OpInfos: {len(SELECTED)} selected, {len(per_op)} run, {ops_pass} passing every sample run "
        f"({ops_skipped} with every sample skipped, {len(per_op) - ops_pass - ops_skipped} with a failure or xfail)",
        f"samples: {run} run, {counts['passed']} passed ({counts['nothing']} with nothing to compile), "
        f"{counts['xfailed']} known failures (xfail), {counts['failed']} failed, {counts['xpassed']} xpassed, "
        f"{counts['skipped']} skipped because eager raises",
    ]
    if nothing:
        lines.append(f"  nothing to compile (no graph reached polytile): {', '.join(nothing[:12])}"
                     f"{f' ... ({len(nothing)} in all)' if len(nothing) > 12 else ''}")
    for reason, ids in sorted(skips.items()):
        lines.append(f"  skipped x{len(ids)}: {reason}  [{', '.join(ids[:4])}{' ...' if len(ids) > 4 else ''}]")
    if known_hit:
        lines.append("known failures hit (KNOWN_FAILURES):")
        lines += [f"  {label} samples {_ranges(idx)}: {reason}" for (label, reason), idx in known_hit.items()]
    return lines


if __name__ == "__main__":
    if "--select" in sys.argv:
        sel = select_opinfos(verbose=True)
        print("SELECTED: dict[tuple[str, str], int] = {")
        for (name, variant), n in sel.items():
            print(f"    ({name!r}, {variant!r}): {n},")
        print("}")
        print(f"# {len(sel)} OpInfos, {sum(sel.values())} samples", file=sys.stderr)
