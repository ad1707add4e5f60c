"""Building the models of the lists offline with random weights, and their seeded inputs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .lists import Spec

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
        from ..zoo import _t5_small_config

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
    except TypeError as e:
        # a model without stochastic depth takes no drop_path_rate (dropout is turned off
        # module by module afterwards in training mode anyway)
        if "drop_path_rate" not in str(e) or "drop_path_rate" in spec.overrides:
            raise
        kw.pop("drop_path_rate")
        return timm.create_model(spec.name, pretrained=False, **kw)


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
