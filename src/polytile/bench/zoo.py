"""The model set of ``shared/bench/models.csv``: built offline, random weights, seeded inputs.

TIMM models come from ``timm.create_model(name, pretrained=False)``; Hugging Face models from
their config class's defaults (class name -> default config), as PyTorch's
benchmarks/dynamo/huggingface.py does. Nothing is downloaded.
"""
from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from typing import Any, Callable

import torch

SEQ_LEN = 128


@dataclass(frozen=True)
class ModelSpec:
    suite: str
    name: str
    batch: int


@dataclass
class Workload:
    spec: ModelSpec
    model: torch.nn.Module
    args: tuple
    kwargs: dict

    def __call__(self, m: Callable | None = None) -> Any:
        return (self.model if m is None else m)(*self.args, **self.kwargs)


def default_models_csv() -> str | None:
    """``shared/bench/models.csv`` next to (or above) the working tree, if present."""
    here = os.path.abspath(os.getcwd())
    for _ in range(4):
        cand = os.path.join(here, "..", "shared", "bench", "models.csv")
        if os.path.exists(cand):
            return os.path.normpath(cand)
        cand = os.path.join(here, "shared", "bench", "models.csv")
        if os.path.exists(cand):
            return cand
        here = os.path.dirname(here)
    return None


def read_models(path: str) -> list[ModelSpec]:
    out = []
    with open(path) as f:
        rows = [line for line in f if line.strip() and not line.lstrip().startswith("#")]
    for row in csv.reader(rows):
        suite, name, batch = (x.strip() for x in row[:3])
        out.append(ModelSpec(suite, name, int(batch)))
    return out


def _t5_small_config():
    import transformers

    # the published t5-small hyper-parameters, written out (no download)
    return transformers.T5Config(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6,
                                 num_decoder_layers=6, num_heads=8, relative_attention_num_buckets=32,
                                 dropout_rate=0.1, layer_norm_epsilon=1e-6, feed_forward_proj="relu",
                                 is_encoder_decoder=True, pad_token_id=0, eos_token_id=1,
                                 decoder_start_token_id=0)


def _no_dropout(config) -> None:
    """Every dropout probability of a Hugging Face config set to 0 (training comparisons)."""
    for k, v in vars(config).items():
        if "dropout" in k and isinstance(v, float):
            setattr(config, k, 0.0)


def _hf(spec: ModelSpec, batch: int, gen: torch.Generator, dropout: bool = True) -> Workload:
    import transformers

    if spec.name == "T5Small":
        config = _t5_small_config()
        cls = transformers.T5ForConditionalGeneration
    else:
        cls = getattr(transformers, spec.name)
        config = cls.config_class()
    if spec.name.endswith("ForCausalLM") and hasattr(config, "is_decoder"):
        config.is_decoder = True
    if hasattr(config, "use_cache"):
        config.use_cache = False  # inference without a KV cache object among the outputs
    if not dropout:
        _no_dropout(config)
    if getattr(config, "pad_token_id", 0) is None and spec.name.endswith("ForSequenceClassification"):
        config.pad_token_id = getattr(config, "eos_token_id", None) or 0  # batches of more than one sequence
    model = cls(config).eval()
    vocab = getattr(config, "vocab_size", 30000)
    ids = torch.randint(0, vocab, (batch, SEQ_LEN), generator=gen)
    kwargs: dict = {"input_ids": ids}
    if getattr(config, "is_encoder_decoder", False):
        kwargs["decoder_input_ids"] = torch.randint(0, vocab, (batch, SEQ_LEN), generator=gen)
    return Workload(spec, model, (), kwargs)


def _timm(spec: ModelSpec, batch: int, gen: torch.Generator) -> Workload:
    import timm

    model = timm.create_model(spec.name, pretrained=False).eval()
    c, h, w = model.default_cfg.get("input_size", (3, 224, 224))
    x = torch.randn(batch, c, h, w, generator=gen)
    return Workload(spec, model, (x,), {})


def build(spec: ModelSpec, batch: int | None = None, seed: int = 0, dropout: bool = True,
          dtype: torch.dtype | None = None) -> Workload:
    """The model (in eval mode) and its inputs; ``dropout=False``: every dropout probability 0
    (so that a model in train mode is deterministic); ``dtype``: the model's floating-point
    parameters and inputs in that type (bfloat16, float16)."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    b = batch or spec.batch
    if spec.suite == "huggingface":
        w = _hf(spec, b, gen, dropout)
    elif spec.suite == "timm":
        w = _timm(spec, b, gen)
    else:
        raise ValueError(f"unknown suite {spec.suite!r}")
    if not dropout:
        for m in w.model.modules():
            if isinstance(m, torch.nn.Dropout):
                m.p = 0.0
    if dtype is not None:
        def cast(x):
            return x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x

        w.model = w.model.to(dtype)
        w.args = tuple(cast(a) for a in w.args)
        w.kwargs = {k: cast(v) for k, v in w.kwargs.items()}
    return w
