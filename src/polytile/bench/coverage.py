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

import argparse
import collections
import copy
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

SUITES = ("hf", "timm", "torchbench")
STATUSES = ("pass", "fallback", "fail_accuracy", "crash", "timeout", "fail_eager", "not_buildable", "too_large")
NOT_POLYTILE = ("fail_eager", "not_buildable", "too_large")  # left out of the pass rate
TOL_INFERENCE = 1e-3
TOL_TRAIN = 1e-2
SEQ_LEN = 128
_SPECIAL_KEYS = ("seq_len", "input_size")  # overrides that shape the inputs, not the model

# PyTorch's huggingface.py EXTRA_MODELS (and list names that are not transformers classes):
# name -> (transformers class, config keyword arguments). PyTorch loads these configs from the
# Hub (AutoConfig.from_pretrained); offline, the config class's defaults stand in (FNetConfig,
# ConvBertConfig and LongformerConfig default to the base models), except where noted.
HF_EXTRA: dict[str, tuple[str, dict]] = {
    "AllenaiLongformerBase": ("LongformerForMaskedLM", {}),  # allenai/longformer-base-4096
    "GoogleFnet": ("FNetForMaskedLM", {}),  # google/fnet-base
    "DistillGPT2": ("GPT2LMHeadModel", {"n_layer": 6}),  # distilgpt2: GPT-2 with 6 layers
    "YituTechConvBert": ("ConvBertForMaskedLM", {}),  # YituTech/conv-bert-base
    "BigBird": ("BigBirdForMaskedLM", {"attention_type": "block_sparse"}),
    "CamemBert": ("CamembertForMaskedLM", {}),  # camembert-base
    "Reformer": ("ReformerForMaskedLM", {}),
    "T5Small": ("T5ForConditionalGeneration", {}),  # zoo._t5_small_config: t5-small written out
}
# TorchBench names that are torchvision models under another name
TV_NAMES = {"vision_maskrcnn": "maskrcnn_resnet50_fpn"}


class NotBuildable(Exception):
    pass


@dataclass
class Spec:
    suite: str  # hf | timm | torchbench
    name: str
    list_batch: int | None = None  # the batch size the list gives (GPU/CPU benchmark default)
    overrides: dict = field(default_factory=dict)  # config/create_model keywords, seq_len, input_size
    source: str = ""  # the list section it came from


# ----------------------------------------------------------------------------- model lists

def default_lists_dir() -> str | None:
    """``shared/bench/pytorch2`` next to (or above) the working tree, if present."""
    from . import zoo

    csv = zoo.default_models_csv()
    cands = [os.path.join(os.path.dirname(csv), "pytorch2")] if csv else []
    here = os.path.abspath(os.getcwd())
    for _ in range(4):
        cands += [os.path.join(here, "..", "shared", "bench", "pytorch2"), os.path.join(here, "shared", "bench", "pytorch2")]
        here = os.path.dirname(here)
    cands.append("/work/shared/bench/pytorch2")
    return next((os.path.normpath(c) for c in cands if os.path.isdir(c)), None)


def parse_line(line: str, suite: str) -> Spec | None:
    """One list line: ``name``, ``name,batch`` or ``name batch``; in a ``--models-file`` also
    ``suite:name[,batch] [{json overrides}]``."""
    line = line.strip()
    if not line or line.startswith("#"):
        return None
    overrides: dict = {}
    if "{" in line:
        k = line.index("{")
        overrides = json.loads(line[k:])
        line = line[:k].strip()
    m = re.match(r"^(hf|huggingface|timm|torchbench|tv|torchvision):(.*)$", line)
    if m:
        suite = {"huggingface": "hf", "tv": "torchbench", "torchvision": "torchbench"}.get(m.group(1), m.group(1))
        line = m.group(2).strip()
    toks = [t for t in re.split(r"[,\s]+", line) if t]
    if not toks:
        return None
    batch = int(toks[1]) if len(toks) > 1 and toks[1].isdigit() else None
    return Spec(suite, toks[0], batch, overrides)


def parse_file(path: str, suite: str, torchbench_sections: bool = False) -> list[Spec]:
    """Every model line of a list file, in order, each with the section header it came under.
    ``torchbench_sections``: a header naming TorchBench (the HF file's tail holds the TorchBench
    lists) switches the following lines to the torchbench suite."""
    out, section, cur = [], "", suite
    with open(path) as f:
        for line in f:
            s = line.strip()
            if s.startswith("#"):
                if s.lstrip("# ").startswith(("Source", "----", "pytorch/")):
                    section = s.lstrip("# ").strip()
                    if torchbench_sections and "torchbench" in s.lower():
                        cur = "torchbench"
                continue
            spec = parse_line(s, cur)
            if spec is not None:
                spec.source = section
                out.append(spec)
    return out


def _dedup(specs: list[Spec]) -> list[Spec]:
    seen: dict[tuple, Spec] = {}
    for s in specs:
        key = (s.suite, s.name)
        if key not in seen:
            seen[key] = s
        elif seen[key].list_batch is None:
            seen[key].list_batch = s.list_batch
    return list(seen.values())


def read_suite(lists_dir: str, suite: str) -> list[Spec]:
    """The models of one suite, deduplicated over the sections of its files, in list order:
    hf: huggingface_models.txt (GPU and CPU lists); timm: timm_models.txt (current, CPU and the
    historical 61-model list); torchbench: torchbench_models.txt and the TorchBench lists at the
    end of huggingface_models.txt."""
    hf_file = parse_file(os.path.join(lists_dir, "huggingface_models.txt"), "hf", torchbench_sections=True)
    if suite == "hf":
        return _dedup([s for s in hf_file if s.suite == "hf"])
    if suite == "timm":
        return _dedup(parse_file(os.path.join(lists_dir, "timm_models.txt"), "timm"))
    if suite == "torchbench":
        return _dedup(parse_file(os.path.join(lists_dir, "torchbench_models.txt"), "torchbench")
                      + [s for s in hf_file if s.suite == "torchbench"])
    raise ValueError(f"unknown suite {suite!r}")


def select(specs: list[Spec], only: list[str] | None = None, limit: int | None = None) -> list[Spec]:
    if only:
        specs = [s for s in specs if s.name in only]
    return specs[:limit] if limit else specs


# ----------------------------------------------------------------------------- building

@dataclass
class Workload:
    model: Any
    args: tuple
    kwargs: dict
    batch: int

    def __call__(self, m: Callable | None = None) -> Any:
        return (self.model if m is None else m)(*self.args, **self.kwargs)

    @property
    def inputs(self):
        return self.kwargs or self.args


def _no_dropout_config(config) -> None:
    """Every float config attribute naming a dropout (or layer drop / drop path) set to 0."""
    for k in list(config.to_dict()):
        v = getattr(config, k, None)
        if "drop" in k and isinstance(v, float):
            setattr(config, k, 0.0)


def _hf_model(spec: Spec, train: bool):
    import transformers

    if "/" in spec.name:
        raise NotBuildable("a Hub checkpoint id (PyTorch runs it as an LLM generate() benchmark from the "
                           "downloaded config); nothing is downloaded here")
    cls_name, kw = HF_EXTRA.get(spec.name, (spec.name, {}))
    cls = getattr(transformers, cls_name, None)
    if cls is None or not hasattr(cls, "config_class"):
        raise NotBuildable(f"transformers {transformers.__version__} has no model class {cls_name!r}")
    if spec.name == "T5Small":
        from .zoo import _t5_small_config

        config = _t5_small_config()
    else:
        config = cls.config_class(**kw)
    if cls_name.startswith(("GPT2ForSequenceClassification", "GPTNeoForSequenceClassification",
                            "GPTJForSequenceClassification", "Roberta", "Marian")):
        config.pad_token_id = 0  # as huggingface.py: some models need a pad token
    if cls_name.endswith("ForCausalLM") and hasattr(config, "is_decoder"):
        config.is_decoder = True
    if hasattr(config, "use_cache"):
        config.use_cache = False  # no KV cache object among the outputs
    for k, v in spec.overrides.items():
        if k not in _SPECIAL_KEYS:
            setattr(config, k, v)
    if train:
        _no_dropout_config(config)
    return cls(config)


def _hf_inputs(spec: Spec, model, batch: int, gen) -> Workload:
    import torch

    config = model.config
    seq = int(spec.overrides.get("seq_len", SEQ_LEN))
    for k in ("max_position_embeddings", "n_positions", "max_target_positions"):
        v = getattr(config, k, None)
        if isinstance(v, int) and 0 < v < seq:
            seq = v
    vocab = getattr(config, "vocab_size", None) or 30000
    ids = torch.randint(0, vocab, (batch, seq), generator=gen)
    eos = getattr(config, "eos_token_id", None)
    if "Bart" in spec.name and isinstance(eos, int):
        ids[:, -1] = eos
    kwargs = {"input_ids": ids}
    if getattr(config, "is_encoder_decoder", False):
        kwargs["decoder_input_ids"] = torch.randint(0, vocab, (batch, seq), generator=gen)
    return Workload(model, (), kwargs, batch)


def _timm_model(spec: Spec, train: bool):
    import timm

    kw = {k: v for k, v in spec.overrides.items() if k not in _SPECIAL_KEYS}
    if train:
        kw.setdefault("drop_rate", 0.0)
        kw.setdefault("drop_path_rate", 0.0)
    try:
        return timm.create_model(spec.name, pretrained=False, **kw)
    except RuntimeError as e:
        if "Unknown model" in str(e):
            raise NotBuildable(f"timm {timm.__version__}: {e}") from None
        raise


def _image_inputs(spec: Spec, model, batch: int, gen, default=(3, 224, 224)) -> Workload:
    import torch

    size = spec.overrides.get("input_size")
    if size is None:
        cfg = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None) or {}
        size = cfg.get("input_size", default)
    return Workload(model, (torch.randn(batch, *size, generator=gen),), {}, batch)


def _tv_name(name: str) -> str:
    import torchvision

    tv = TV_NAMES.get(name, name)
    if tv not in torchvision.models.list_models():
        raise NotBuildable("a TorchBench model that is not a torchvision model (needs the torchbenchmark "
                           "package, not available here)")
    return tv


def _tv_model(spec: Spec, train: bool):
    import torchvision

    tv = _tv_name(spec.name)
    kw = {k: v for k, v in spec.overrides.items() if k not in _SPECIAL_KEYS}
    if tv in ("googlenet", "inception_v3"):
        kw.setdefault("init_weights", True)
    if tv in torchvision.models.list_models(torchvision.models.detection):
        kw.setdefault("weights_backbone", None)
    return torchvision.models.get_model(tv, weights=None, **kw)


def _tv_inputs(spec: Spec, model, batch: int, gen) -> Workload:
    import torch
    import torchvision

    tv = _tv_name(spec.name)
    if tv in torchvision.models.list_models(torchvision.models.detection):
        c, h, w = spec.overrides.get("input_size", (3, 427, 640))  # a COCO-sized image
        return Workload(model, ([torch.rand(c, h, w, generator=gen) for _ in range(batch)],), {}, batch)
    default = (3, 299, 299) if tv == "inception_v3" else (3, 224, 224)
    size = spec.overrides.get("input_size", default)
    return Workload(model, (torch.randn(batch, *size, generator=gen),), {}, batch)


_BUILDERS = {"hf": (_hf_model, _hf_inputs), "timm": (_timm_model, _image_inputs), "torchbench": (_tv_model, _tv_inputs)}


def default_batch(spec: Spec, train: bool) -> int:
    """Batch 1; 2 for vision models in training (batch norm in train mode needs more than one
    value per channel after global pooling)."""
    return 2 if (train and spec.suite != "hf") else 1


def count_parameters(spec: Spec, train: bool) -> int | None:
    """Elements of the model's parameters and buffers, built on the meta device (nothing
    allocated); None when the model cannot be built there."""
    import torch

    make_model, _ = _BUILDERS[spec.suite]
    try:
        with torch.device("meta"):
            m = make_model(spec, train)
    except NotBuildable:
        raise
    except Exception:
        return None
    return sum(p.numel() for p in m.parameters()) + sum(b.numel() for b in m.buffers())


def build(spec: Spec, batch: int, train: bool = False, seed: int = 0) -> Workload:
    """The model (eval mode; train mode with every dropout probability 0 when ``train``) and its
    seeded inputs."""
    import torch

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    make_model, make_inputs = _BUILDERS[spec.suite]
    model = make_model(spec, train)
    w = make_inputs(spec, model, batch, gen)
    if train:
        for m in model.modules():
            if isinstance(m, torch.nn.Dropout):
                m.p = 0.0
        model.train()
    else:
        model.eval()
    return w


# ----------------------------------------------------------------------------- one model

def _short(e: BaseException, n: int = 500) -> str:
    msg = str(e).strip()
    return f"{type(e).__name__}: {msg}"[:n]


def _polytile_dir() -> str:
    import polytile

    return os.path.dirname(os.path.abspath(polytile.__file__))


def _chain(e: BaseException) -> list[BaseException]:
    """``e`` and the exceptions it wraps: dynamo's ``inner_exception`` (BackendCompilerFailed
    is raised ``from None``), else ``__cause__``, else ``__context__``."""
    out: list[BaseException] = []
    x: BaseException | None = e
    while x is not None and all(x is not y for y in out):
        out.append(x)
        inner = getattr(x, "inner_exception", None)
        if isinstance(inner, BaseException):
            x = inner
        elif x.__cause__ is not None:
            x = x.__cause__
        else:
            x = None if x.__suppress_context__ else x.__context__
    return out


def _frame_text(fs: traceback.FrameSummary, root: str) -> str:
    path = os.path.relpath(fs.filename, os.path.dirname(root))
    return f"{path}:{fs.lineno} in {fs.name}: {(fs.line or '').strip()}"[:240]


def crash_info(e: BaseException, n_frames: int = 6) -> dict:
    """Type and message of the innermost exception of ``e``'s chain (dynamo wraps a backend's
    exception in BackendCompilerFailed), and the last ``n_frames`` frames inside polytile."""
    root = _polytile_dir()
    chain = _chain(e)
    inner = chain[-1]
    frames: list[str] = []
    for x in reversed(chain):  # innermost first: the first exception with frames in polytile
        tb = traceback.extract_tb(x.__traceback__)
        mine = [fs for fs in tb if os.path.abspath(fs.filename).startswith(root + os.sep)]
        if mine:
            frames = [_frame_text(fs, root) for fs in mine[-n_frames:]]
            break
    return {"type": type(inner).__name__, "message": str(inner).strip()[:1500],
            "outer": type(e).__name__ if inner is not e else "", "polytile_frames": frames}


class _LogCapture(logging.Handler):
    """polytile's warnings (ops run in ATen and why, graphs whose compilation failed)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        msg = record.getMessage().strip().splitlines()
        if msg and len(self.messages) < 60:
            self.messages.append(" ".join(msg[:2])[:400])


def _first_tensor(out):
    from .train import _first_tensor as ft

    return ft(out)


def _grads(model) -> dict:
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def _train_step(w: Workload, model, call=None) -> dict:
    """zero_grad, forward, loss = mean square of the first output tensor, backward; the loss
    and the gradients."""
    model.zero_grad(set_to_none=True)
    loss = _first_tensor(w(model if call is None else call)).float().pow(2).mean()
    loss.backward()
    return {"loss": loss.detach(), "grads": _grads(model)}


def _to64(x):
    import torch

    if isinstance(x, torch.Tensor):
        return x.double() if x.is_floating_point() else x
    if isinstance(x, (list, tuple)):
        return type(x)(_to64(v) for v in x)
    if isinstance(x, dict):
        return {k: _to64(v) for k, v in x.items()}
    return x


def _fp64_train(w: Workload, init) -> dict:
    m = copy.deepcopy(init).double()
    w64 = Workload(m, _to64(w.args), _to64(w.kwargs), w.batch)
    return _train_step(w64, m)


def _safe_thunk(f: Callable[[], Any], notes: list[str]) -> Callable[[], Any]:
    """The fp64 reference, or None (a failing leaf then fails) when it cannot be computed."""
    def thunk():
        try:
            return f()
        except Exception as e:
            notes.append("fp64 reference failed: " + _short(e, 200))
            return None
    return thunk


def _graph_breaks() -> tuple[int, list[str]]:
    try:
        from torch._dynamo.utils import counters

        gb = counters.get("graph_break", {})
        return int(sum(gb.values())), [str(k)[:200] for k, _ in collections.Counter(gb).most_common(5)]
    except Exception:
        return 0, []


def run_one(spec: Spec, cfg: dict, progress: Callable[[dict], None] | None = None) -> dict:
    """Build, run eager, compile with polytile, check, classify one model in this process.

    ``cfg``: threads, batch (None: ``default_batch``), train, inductor, rounds, max_bytes,
    cache_dir (polytile's kernel cache; None: a fresh temporary one). ``progress(result)`` is
    called at the start of every phase with the result so far."""
    import torch

    import polytile
    from ..accuracy import check_accuracy, fp64_reference
    from ..benchmarking import time_side_by_side

    train = bool(cfg.get("train"))
    threads = int(cfg.get("threads", 2))
    torch.set_num_threads(threads)
    batch = cfg.get("batch") or default_batch(spec, train)
    r: dict = {"suite": spec.suite, "name": spec.name, "batch": batch, "mode": "train" if train else "inference",
               "status": None, "phase": "start", "error": "", "crash": None, "accuracy": "",
               "fallbacks": {}, "graphs_failed": 0, "graphs_compiled": 0, "kernels": 0, "eager_runs": 0,
               "graph_breaks": 0, "graph_break_reasons": [], "warnings": [], "notes": [],
               "params_m": None, "eager_s": None, "compile_s": None, "inductor_compile_s": None,
               "eager_ms": None, "polytile_ms": None, "inductor_ms": None,
               "speedup_eager": None, "speedup_inductor": None, "inductor_error": ""}
    t_start = time.perf_counter()

    def phase(p: str) -> None:
        r["phase"] = p
        r["elapsed_s"] = round(time.perf_counter() - t_start, 2)
        if progress:
            progress(r)

    def done(status: str) -> dict:
        r["status"] = status
        r["elapsed_s"] = round(time.perf_counter() - t_start, 2)
        r["final"] = True
        if progress:
            progress(r)
        return r

    own_cache = None
    cache_dir = cfg.get("cache_dir")
    if not cache_dir:
        own_cache = cache_dir = tempfile.mkdtemp(prefix="polytile-cov-cache-")
    capture = _LogCapture()
    logging.getLogger("polytile").addHandler(capture)
    try:
        phase("build")
        try:
            n = count_parameters(spec, train)
            if n is not None:
                r["params_m"] = round(n / 1e6, 2)
                need = n * 4 * (6 if train else 4)  # model, fp64 copy (2x), derived weights / grads
                if cfg.get("max_bytes") and need > cfg["max_bytes"]:
                    r["error"] = (f"{n / 1e6:.0f}M parameters: about {need / 1e9:.1f} GB needed, budget "
                                  f"{cfg['max_bytes'] / 1e9:.1f} GB (--max-gb)")
                    return done("too_large")
            w = build(spec, batch, train=train)
        except NotBuildable as e:
            r["error"] = str(e)
            return done("not_buildable")
        except Exception as e:
            r["error"] = "building the model: " + _short(e)
            return done("not_buildable")
        if r["params_m"] is None:
            r["params_m"] = round(sum(p.numel() for p in w.model.parameters()) / 1e6, 2)
        model = w.model
        init = copy.deepcopy(model) if train else None
        options = {"threads": threads, "cache_dir": cache_dir, **(cfg.get("options") or {})}
        tol = TOL_TRAIN if train else TOL_INFERENCE
        grad_ctx = torch.enable_grad if train else torch.no_grad
        with grad_ctx():
            phase("eager")
            try:
                t0 = time.perf_counter()
                ref = _train_step(w, model) if train else w()
                r["eager_s"] = round(time.perf_counter() - t0, 3)
            except Exception as e:
                r["error"] = _short(e)
                return done("fail_eager")
            phase("compile")
            torch._dynamo.reset()
            polytile.reset_stats()
            mine = copy.deepcopy(init) if train else model
            try:
                compiled = torch.compile(mine, backend="polytile", options=options)
                t0 = time.perf_counter()
                out = _train_step(w, mine, compiled) if train else w(compiled)
                r["compile_s"] = round(time.perf_counter() - t0, 3)
                crashed = None
            except Exception as e:
                crashed = e
            st = polytile.stats()
            r["fallbacks"] = st["ops_fallen_back"]
            for k in ("graphs_failed", "graphs_compiled", "eager_runs"):
                r[k] = st.get(k, 0)
            r["kernels"] = st.get("kernels_generated", 0)
            r["graph_breaks"], r["graph_break_reasons"] = _graph_breaks()
            r["warnings"] = list(dict.fromkeys(capture.messages))
            if crashed is not None:
                r["crash"] = crash_info(crashed)
                r["error"] = f"{r['crash']['type']}: {r['crash']['message'][:300]}"
                return done("crash")
            phase("accuracy")
            notes: list[str] = []
            if train:
                thunk = _safe_thunk(lambda: _fp64_train(w, init), notes)
            else:
                thunk = _safe_thunk(lambda: fp64_reference(model, w.inputs), notes)
            try:
                ok, details = check_accuracy(out, ref, thunk, tol)
            except Exception as e:
                ok, details = False, ["comparing the outputs failed: " + _short(e, 300)]
            r["notes"] += notes
            r["accuracy"] = "pass" if ok else "; ".join(details)[:1500]
            status = ("pass" if not r["fallbacks"] else "fallback") if ok else "fail_accuracy"
            if cfg.get("inductor"):
                phase("inductor")
                _inductor(r, w, model, init, compiled, mine, train, int(cfg.get("rounds", 3)), time_side_by_side)
            return done(status)
    finally:
        logging.getLogger("polytile").removeHandler(capture)
        if own_cache:
            shutil.rmtree(own_cache, ignore_errors=True)


def _inductor(r: dict, w: Workload, model, init, compiled, mine, train: bool, rounds: int, timer) -> None:
    """Inductor's cold compile time (dynamo reset, no FX-graph / autograd cache), then eager,
    polytile and Inductor timed alternately (median of ``rounds`` calls after one warm-up)."""
    import torch

    import polytile

    try:
        torch._inductor.config.fx_graph_cache = False
        torch._functorch.config.enable_autograd_cache = False
    except Exception:
        pass
    torch._dynamo.reset()
    theirs = copy.deepcopy(init) if train else model
    try:
        ind = torch.compile(theirs)
        t0 = time.perf_counter()
        _train_step(w, theirs, ind) if train else w(ind)
        r["inductor_compile_s"] = round(time.perf_counter() - t0, 3)
    except Exception as e:
        r["inductor_error"] = _short(e, 300)
        ind = None
    if train:
        fns = {"eager": lambda: _train_step(w, model), "polytile": lambda: _train_step(w, mine, compiled)}
        if ind is not None:
            fns["inductor"] = lambda: _train_step(w, theirs, ind)
    else:
        fns = {"eager": lambda: w(), "polytile": lambda: w(compiled)}
        if ind is not None:
            fns["inductor"] = lambda: w(ind)
    try:
        fns["polytile"]()  # dynamo was reset: polytile compiles again here (warm kernel cache)
        before = polytile.stats()["graphs_compiled"]
        t = timer(fns, warmup=1, rounds=max(1, rounds))
        if polytile.stats()["graphs_compiled"] != before:
            r["notes"].append("polytile recompiled during timing")
    except Exception as e:
        r["notes"].append("timing failed: " + _short(e, 300))
        return
    r["eager_ms"], r["polytile_ms"] = round(t["eager"] * 1e3, 3), round(t["polytile"] * 1e3, 3)
    r["inductor_ms"] = round(t["inductor"] * 1e3, 3) if "inductor" in t else None
    r["speedup_eager"] = round(t["eager"] / t["polytile"], 3)
    if "inductor" in t:
        r["speedup_inductor"] = round(t["inductor"] / t["polytile"], 3)


# ----------------------------------------------------------------------------- isolation

_FH_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+) in (\S+)')


def _faulthandler_frames(text: str, n: int = 6) -> list[str]:
    """Where the interpreter was at the last faulthandler dump in ``text`` (a fatal signal, or
    the stack dump shortly before a timeout): the frames inside polytile of the last thread
    block that has any (the main thread is listed last), innermost last; else the innermost
    frames of the last block, marked as outside polytile."""
    k = max(text.rfind("Fatal Python error"), text.rfind("Timeout ("))
    if k < 0:
        return []
    root = _polytile_dir()
    blocks: list[list[tuple[str, str, str]]] = []
    for line in text[k:].splitlines()[1:]:
        if line.startswith(("Thread ", "Current thread ")):
            blocks.append([])
            continue
        m = _FH_FRAME.match(line)
        if m and blocks:
            blocks[-1].append(m.groups())
    blocks = [b for b in blocks if b]
    if not blocks:
        return []

    def fmt(fr):
        f, line, name = fr
        f = os.path.relpath(f, os.path.dirname(root)) if os.path.abspath(f).startswith(root + os.sep) else f
        return f"{f}:{line} in {name}"

    for b in reversed(blocks):
        mine = [fr for fr in b if os.path.abspath(fr[0]).startswith(root + os.sep)]
        if mine:  # faulthandler lists the most recent call first
            return [fmt(fr) for fr in reversed(mine[:n])]
    return ["(outside polytile) " + fmt(fr) for fr in reversed(blocks[-1][:n])]


def _base_result(spec: Spec, cfg: dict) -> dict:
    return {"suite": spec.suite, "name": spec.name, "batch": cfg.get("batch") or default_batch(spec, bool(cfg.get("train"))),
            "mode": "train" if cfg.get("train") else "inference", "status": None, "phase": "start", "error": "",
            "crash": None, "fallbacks": {}, "graphs_failed": 0, "warnings": [], "notes": []}


def _safe_name(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", s)


def run_isolated(spec: Spec, cfg: dict, timeout: float, log_dir: str | None = None) -> dict:
    """``run_one`` in a fresh interpreter with a wall-clock limit; a hang or a dead interpreter
    is recorded as a result."""
    tmp = tempfile.mkdtemp(prefix="polytile-cov-")
    result_path = os.path.join(tmp, "result.json")
    cfg = dict(cfg, cache_dir=os.path.join(tmp, "polytile-cache"), timeout=timeout)
    env = dict(os.environ)
    threads = str(cfg.get("threads", 2))
    env.update(TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "inductor-cache"), OMP_NUM_THREADS=threads,
               POLYTILE_THREADS=threads, PYTHONFAULTHANDLER="1", TOKENIZERS_PARALLELISM="false")
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
        log_path = os.path.join(log_dir, f"{spec.suite}-{_safe_name(spec.name)}.log")
    else:
        log_path = os.path.join(tmp, "log.txt")
    cmd = [sys.executable, "-m", "polytile.bench.coverage", "--one", json.dumps(asdict(spec)),
           "--cfg", json.dumps(cfg), "--result", result_path]
    t0 = time.perf_counter()
    timed_out = False
    with open(log_path, "w") as logf:
        p = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            rc = p.wait()
    wall = time.perf_counter() - t0
    try:
        with open(result_path) as f:
            r = json.load(f)
    except (OSError, ValueError):
        r = _base_result(spec, cfg)
    try:
        with open(log_path, errors="replace") as f:
            log_text = f.read()
    except OSError:
        log_text = ""
    r["wall_s"] = round(wall, 1)
    r["log"] = log_path if log_dir else ""
    if not r.get("final"):
        phase = r.get("phase", "start")
        frames = _faulthandler_frames(log_text)
        if timed_out:
            r["status"] = "timeout"
            r["error"] = f"no result after {timeout:g} s (in phase {phase})"
            r["crash"] = {"type": "timeout", "message": r["error"], "outer": "", "polytile_frames": frames}
        else:
            sig = ""
            if rc < 0:
                try:
                    sig = signal.Signals(-rc).name
                except ValueError:
                    sig = f"signal {-rc}"
            why = f"the interpreter died ({sig or f'exit code {rc}'}) in phase {phase}"
            tail = " | ".join(line.strip() for line in log_text.strip().splitlines()[-4:])[:600]
            if phase in ("start", "build"):
                r["status"], r["error"] = "not_buildable", f"{why}: {tail}"
            elif phase == "eager":
                r["status"], r["error"] = "fail_eager", f"{why}: {tail}"
            else:
                r["status"], r["error"] = "crash", why
                r["crash"] = {"type": sig or f"exit {rc}", "message": f"{why}; log tail: {tail}", "outer": "",
                              "polytile_frames": frames}
    shutil.rmtree(tmp, ignore_errors=True)
    return r


def _child(spec_json: str, cfg_json: str, result_path: str) -> int:
    import faulthandler

    spec = Spec(**json.loads(spec_json))
    cfg = json.loads(cfg_json)
    faulthandler.enable()
    timeout = float(cfg.get("timeout") or 0)
    if timeout > 30:  # where a hang is: a stack dump shortly before the parent kills us
        faulthandler.dump_traceback_later(timeout - min(15.0, timeout * 0.05), exit=False)

    def save(r: dict) -> None:
        tmp = result_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(r, f, default=str)
        os.replace(tmp, result_path)

    try:
        r = run_one(spec, cfg, progress=save)
    except BaseException as e:  # a bug in the harness itself
        r = _base_result(spec, cfg)
        r.update(status="crash", final=True, error="harness: " + _short(e), crash=crash_info(e))
        save(r)
    print(f"coverage child: {spec.suite} {spec.name}: {r['status']}", flush=True)
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown (OpenMP / compiled-kernel unloading at exit)


# ----------------------------------------------------------------------------- report

def summary(results: list[dict]) -> str:
    counts = collections.Counter(r["status"] for r in results)
    denom = len(results) - sum(counts[s] for s in NOT_POLYTILE)
    rate = f"{counts['pass']}/{denom} = {100 * counts['pass'] / denom:.0f}%" if denom else "n/a"
    parts = ", ".join(f"{counts[s]} {s}" for s in STATUSES if counts[s])
    return f"{len(results)} models: {parts}; pass rate {rate} (pass / (all - fail_eager - not_buildable - too_large))"


def _f(x, spec=".1f") -> str:
    return "-" if x is None else format(x, spec)


def fallback_table(results: list[dict]) -> list[tuple[str, int, int, list[str]]]:
    """op -> (models, calls, model names), most models first."""
    models: dict[str, list[str]] = collections.defaultdict(list)
    calls: collections.Counter = collections.Counter()
    for r in results:
        for op, n in (r.get("fallbacks") or {}).items():
            models[op].append(r["name"])
            calls[op] += n
    return sorted(((op, len(ms), calls[op], ms) for op, ms in models.items()), key=lambda t: (-t[1], -t[2], t[0]))


def markdown(results: list[dict], env: dict, command: str, cfg: dict) -> str:
    from ..benchmarking import format_table

    inductor = bool(cfg.get("inductor"))
    rows = []
    for r in results:
        fb = r.get("fallbacks") or {}
        row = [r["suite"], r["name"], r.get("batch", "-"), r["status"], _f(r.get("params_m"), ".3g"),
               _f(r.get("compile_s")), sum(fb.values()), len(fb), r.get("graphs_failed", 0),
               r.get("graph_breaks", 0)]
        if inductor:
            row += [_f(r.get("inductor_compile_s")), _f(r.get("eager_ms")), _f(r.get("polytile_ms")),
                    _f(r.get("inductor_ms")), _f(r.get("speedup_eager"), ".2f"), _f(r.get("speedup_inductor"), ".2f")]
        row.append(_f(r.get("wall_s")))
        rows.append(row)
    headers = ["suite", "model", "batch", "status", "params M", "polytile compile s", "fallback calls",
               "fallback ops", "graphs failed", "graph breaks"]
    if inductor:
        headers += ["inductor compile s", "eager ms", "polytile ms", "inductor ms", "vs eager", "vs inductor"]
    headers.append("wall s")
    out = ["# polytile model coverage (PyTorch 2 benchmark lists)", f"Command: `{command}`",
           "Environment:\n" + "\n".join(f"- {k}: {v}" for k, v in env.items()),
           "**" + summary(results) + "**",
           ("Mode: training (dropout off; one forward and backward, loss = mean square of the first output; "
            f"loss and gradients vs eager by the accuracy rule, tol {TOL_TRAIN})." if cfg.get("train") else
            f"Mode: inference (torch.no_grad, eval; outputs vs eager by the accuracy rule, tol {TOL_INFERENCE}).")
           + " Each model runs in its own interpreter with a fresh polytile kernel cache (and Inductor cache): "
             "`polytile compile s` is the cold first call through torch.compile."
           + (f" Times are medians of {cfg.get('rounds', 3)} alternating calls after one warm-up." if inductor else ""),
           format_table(headers, rows)]
    crashes = [r for r in results if r["status"] in ("crash", "timeout")]
    if crashes:
        lines = []
        for r in crashes:
            c = r.get("crash") or {}
            head = f"- **{r['suite']} {r['name']}** ({r['status']}, phase {r.get('phase', '?')}): "
            head += f"{c.get('type', '')}: {(c.get('message') or r.get('error', ''))[:400]}".replace("\n", " ")
            if c.get("outer"):
                head += f" (raised as {c['outer']})"
            lines.append(head)
            frames = c.get("polytile_frames") or []
            lines += [f"    - `{fr}`" for fr in frames] or ["    - (no frame inside polytile)"]
        out.append("## Crashes and timeouts\n\n" + "\n".join(lines))
    acc = [r for r in results if r["status"] == "fail_accuracy"]
    if acc:
        out.append("## Accuracy failures\n\n" + "\n".join(f"- **{r['suite']} {r['name']}**: {r['accuracy'][:600]}"
                                                        for r in acc))
    table = fallback_table(results)
    if table:
        out.append("## Fallbacks by op\n\n" + format_table(
            ["op", "models", "calls", "which"],
            [[op, m, c, ", ".join(ms[:6]) + (" ..." if len(ms) > 6 else "")] for op, m, c, ms in table]))
    warned: dict[str, list[str]] = collections.defaultdict(list)
    for r in results:
        for w in r.get("warnings") or []:
            warned[w].append(r["name"])
    if warned:
        out.append("## polytile warnings (why ops ran in ATen, failed graph compilations)\n\n" + "\n".join(
            f"- {w} ({len(ms)} model{'s' if len(ms) > 1 else ''}: {', '.join(ms[:5])})"
            for w, ms in sorted(warned.items(), key=lambda kv: -len(kv[1]))))
    other = [r for r in results if r["status"] in NOT_POLYTILE]
    if other:
        out.append("## Not run by polytile (eager failures, not buildable offline, too large)\n\n" + "\n".join(
            f"- {r['suite']} {r['name']} ({r['status']}): {r.get('error', '')[:300]}" for r in other))
    notes = [r for r in results if r.get("notes") or r.get("inductor_error")]
    if notes:
        out.append("## Notes\n\n" + "\n".join(
            f"- {r['name']}: {'; '.join(r.get('notes') or [])} {r.get('inductor_error') or ''}".rstrip() for r in notes))
    return "\n\n".join(out) + "\n"


def write_report(results: list[dict], env: dict, out_dir: str, command: str, cfg: dict) -> dict:
    os.makedirs(out_dir, exist_ok=True)
    paths = {"markdown": os.path.join(out_dir, "report.md"), "json": os.path.join(out_dir, "results.json")}
    for key, text in (("markdown", markdown(results, env, command, cfg)),
                      ("json", json.dumps({"environment": env, "command": command, "config": cfg,
                                           "summary": summary(results), "results": results}, indent=1, default=str))):
        tmp = paths[key] + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, paths[key])
    return paths


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def environment(cfg: dict) -> dict:
    from .suite import environment as env0

    env = env0()
    env["threads"] = cfg.get("threads", 2)
    env["mode"] = "training" if cfg.get("train") else "inference"
    try:
        import torchvision

        env["torchvision"] = torchvision.__version__
    except ImportError:
        pass
    if cfg.get("max_bytes"):
        env["memory budget GB"] = round(cfg["max_bytes"] / 1e9, 1)
    env["timeout s"] = cfg.get("timeout")
    return env


def precheck(spec: Spec) -> str | None:
    """Why ``spec`` cannot be built offline, when that is known from its name alone."""
    try:
        if spec.suite == "hf" and "/" in spec.name:
            _hf_model(spec, False)
        elif spec.suite == "torchbench":
            _tv_name(spec.name)
    except NotBuildable as e:
        return str(e)
    except Exception:
        return None
    return None


def run(specs: list[Spec], cfg: dict, out_dir: str, command: str, *, isolate: bool = True,
        timeout: float = 600.0, echo: Callable[[str], None] | None = print) -> list[dict]:
    """Every spec through ``run_one`` (each in its own interpreter when ``isolate``); the report
    is rewritten after each model."""
    cfg = dict(cfg, timeout=timeout)
    env = environment(cfg)
    results: list[dict] = []
    write_report(results, env, out_dir, command, cfg)
    for k, spec in enumerate(specs, 1):
        reason = precheck(spec)
        if reason:  # known without starting an interpreter
            r = _base_result(spec, cfg)
            r.update(status="not_buildable", error=reason, final=True, wall_s=0.0)
        elif isolate:
            r = run_isolated(spec, cfg, timeout, log_dir=os.path.join(out_dir, "logs"))
        else:
            t0 = time.perf_counter()
            try:
                r = run_one(spec, cfg)
            except Exception as e:
                r = _base_result(spec, cfg)
                r.update(status="crash", error="harness: " + _short(e), crash=crash_info(e))
            r["wall_s"] = round(time.perf_counter() - t0, 1)
        results.append(r)
        write_report(results, env, out_dir, command, cfg)
        if echo:
            fb = r.get("fallbacks") or {}
            extra = f"compile {r['compile_s']:.1f} s, " if r.get("compile_s") is not None else ""
            extra += f"{sum(fb.values())} fallbacks over {len(fb)} ops" if fb else ""
            if r["status"] not in ("pass", "fallback") and r.get("error"):
                extra = (extra + "; " if extra else "") + r["error"][:160].replace("\n", " ")
            echo(f"[{k}/{len(specs)}] {spec.suite} {spec.name}: {r['status']} ({extra.strip(', ')}) "
                 f"{r.get('wall_s', 0):.0f} s")
    return results


def collect(suite: str, only: list[str], limit: int | None, lists_dir: str | None, models_file: str | None) -> list[Spec]:
    suites = SUITES if suite == "all" else (suite,)
    if models_file:
        specs = parse_file(models_file, suite if suite != "all" else "")
        bad = [s.name for s in specs if s.suite not in SUITES]
        if bad:
            raise ValueError(f"{models_file}: no suite for {bad} (prefix hf:, timm: or torchbench:, or pass --suite)")
        return select([s for s in specs if s.suite in suites], only, limit)
    if not lists_dir:
        raise FileNotFoundError("cannot find shared/bench/pytorch2; pass --lists-dir")
    return [s for su in suites for s in select(read_suite(lists_dir, su), only, limit)]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suite", choices=["hf", "timm", "torchbench", "all"], default="all")
    p.add_argument("--only", action="append", default=[], metavar="NAME", help="only this model (repeatable)")
    p.add_argument("--limit", type=int, default=None, help="the first N models of each suite")
    p.add_argument("--models-file", default=None,
                   help="a custom list: lines 'suite:name[,batch] [{json overrides}]' (suite: hf, timm, torchbench)")
    p.add_argument("--lists-dir", default=None, help="default: shared/bench/pytorch2")
    p.add_argument("--batch", type=int, default=None, help="default 1 (2 for vision models with --train)")
    p.add_argument("--timeout", type=float, default=600.0, help="wall-clock seconds per model")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--inductor", action="store_true",
                   help="also Inductor's cold compile time and eager/polytile/Inductor speedups (slow)")
    p.add_argument("--rounds", type=int, default=3, help="timed alternating calls per system (with --inductor)")
    p.add_argument("--train", action="store_true", help="training mode: one forward+backward, gradients vs eager")
    p.add_argument("--max-gb", type=float, default=None,
                   help="skip models whose parameters need more memory (default: 70%% of MemAvailable)")
    p.add_argument("--options", default=None, metavar="JSON", help="extra polytile options")
    p.add_argument("--in-process", action="store_true", help="no subprocess per model (no timeout; for debugging)")
    p.add_argument("--out", default="coverage-out", help="folder for report.md, results.json, logs/")


def main_args(a: argparse.Namespace, command: str) -> int:
    try:
        specs = collect(a.suite, a.only, a.limit, a.lists_dir or default_lists_dir(), a.models_file)
    except (OSError, ValueError) as e:
        print(f"polytile: {e}", file=sys.stderr)
        return 2
    if not specs:
        print("polytile: no model matches", file=sys.stderr)
        return 2
    avail = _mem_available()
    max_bytes = int(a.max_gb * 1e9) if a.max_gb else (int(avail * 0.7) if avail else None)
    cfg = {"threads": a.threads, "batch": a.batch, "train": a.train, "inductor": a.inductor, "rounds": a.rounds,
           "max_bytes": max_bytes, "options": json.loads(a.options) if a.options else None}
    results = run(specs, cfg, a.out, command, isolate=not a.in_process, timeout=a.timeout)
    print(summary(results))
    print(f"report: {os.path.join(a.out, 'report.md')}  results: {os.path.join(a.out, 'results.json')}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--one":  # the per-model child process
        ap = argparse.ArgumentParser(prog="polytile.bench.coverage --one")
        ap.add_argument("--one", required=True)
        ap.add_argument("--cfg", required=True)
        ap.add_argument("--result", required=True)
        c = ap.parse_args(argv)
        return _child(c.one, c.cfg, c.result)
    ap = argparse.ArgumentParser(prog="python -m polytile.bench.coverage")
    add_arguments(ap)
    return main_args(ap.parse_args(argv), "python -m polytile.bench.coverage " + " ".join(argv))


if __name__ == "__main__":
    sys.exit(main())
