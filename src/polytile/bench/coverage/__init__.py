"""Model coverage over PyTorch 2's own benchmark lists: ``polytile bench coverage``.

Reads the Hugging Face, TIMM and TorchBench model lists of ``shared/bench/pytorch2/`` (copies
of pytorch/pytorch ``benchmarks/dynamo/*_models_list*.txt``), builds every model offline with
random weights (Hugging Face: the model class's config class with default arguments, as
PyTorch's ``benchmarks/dynamo/huggingface.py`` does, with its ``EXTRA_MODELS`` names mapped to
classes here; TIMM: ``timm.create_model(name, pretrained=False)``; TorchBench: only its
torchvision models, ``torchvision.models.get_model(name, weights=None)``), runs it in eager and
through ``torch.compile(model, backend="polytile")`` and classifies it:

- ``pass``: accurate (DESIGN.md section 4, tol 1e-3; 1e-2 for training gradients) and no op
  run through ATen;
- ``fallback``: accurate, some ops ran through ATen (``polytile.stats()["ops_fallen_back"]``);
- ``fail_accuracy``: compiled, but the result is not accurate;
- ``crash``: an exception out of ``torch.compile`` / the compiled call (type, message and the
  last traceback frames inside polytile are recorded), or the interpreter died (signal);
- ``timeout``: no result within ``--timeout`` seconds (the phase it was in, and where it hung,
  are recorded);
- ``fail_eager``: eager itself fails (not polytile's problem);
- ``not_buildable``: cannot be built offline (a Hub checkpoint, a TorchBench model that is not a
  torchvision model, a name the installed library does not know);
- ``too_large``: the model's parameters would not fit the memory budget (``--max-gb``;
  counted on the meta device before anything is allocated).

The pass rate is pass / (all - fail_eager - not_buildable - too_large).

Every model runs in its own interpreter (``python -m polytile.bench.coverage --one ...``) with a
wall-clock limit, a fresh polytile kernel cache and a fresh Inductor cache (compile times are
cold), so that a hang or a segfault is recorded and the run goes on. ``report.md`` and
``results.json`` are rewritten after every model.
"""
from __future__ import annotations

from .build import (HF_EXTRA, SEQ_LEN, TV_NAMES, NotBuildable, Workload, _BUILDERS, _SPECIAL_KEYS, _hf_inputs,
                    _hf_model, _image_inputs, _no_dropout_config, _timm_model, _tv_inputs, _tv_model, _tv_name, build,
                    count_parameters, default_batch, precheck)
from .cli import _mem_available, add_arguments, main, main_args
from .isolate import _FH_FRAME, _base_result, _child, _faulthandler_frames, _safe_name, run, run_isolated
from .lists import SUITES, Spec, _dedup, collect, default_lists_dir, parse_file, parse_line, read_suite, select
from .report import NOT_POLYTILE, STATUSES, _f, environment, fallback_table, markdown, summary, write_report
from .runner import (TOL_INFERENCE, TOL_TRAIN, _chain, _first_tensor, _fp64_train, _frame_text, _graph_breaks,
                     _grads, _inductor, _LogCapture, _polytile_dir, _safe_thunk, _short, _to64, _train_step,
                     crash_info, run_one)

__all__ = [
    "HF_EXTRA", "NOT_POLYTILE", "SEQ_LEN", "STATUSES", "SUITES", "TOL_INFERENCE", "TOL_TRAIN", "TV_NAMES",
    "NotBuildable", "Spec", "Workload", "add_arguments", "build", "collect", "count_parameters", "crash_info",
    "default_batch", "default_lists_dir", "environment", "fallback_table", "main", "main_args", "markdown",
    "parse_file", "parse_line", "precheck", "read_suite", "run", "run_isolated", "run_one", "select", "summary",
    "write_report",
]
