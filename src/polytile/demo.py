"""`polytile demo`: compile timm resnet18 and BERT (BertConfig() defaults, random weights),
check them against eager and time eager / Inductor / polytile side by side."""
from __future__ import annotations

import time

import torch

from .benchmarking import format_table, time_side_by_side


def _models(seq: int):
    import timm
    import transformers

    torch.manual_seed(0)
    r18 = timm.create_model("resnet18", pretrained=False).eval()
    yield "timm resnet18 (batch 1, 224x224)", r18, (torch.randn(1, 3, 224, 224),)
    bert = transformers.BertModel(transformers.BertConfig()).eval()
    ids = torch.randint(0, bert.config.vocab_size, (1, seq))
    yield f"HF BertModel (BertConfig(), batch 1, seq {seq})", bert, (ids,)


def _first_tensor(out):
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "last_hidden_state"):
        return out.last_hidden_state
    if isinstance(out, (tuple, list)):
        return _first_tensor(out[0])
    raise TypeError(type(out))


def run_demo(threads: int | None = None, rounds: int = 10, seq: int = 128, inductor: bool = True) -> str:
    import polytile

    threads = threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    rows = []
    for name, model, args in _models(seq):
        torch._dynamo.reset()
        polytile.reset_stats()
        with torch.no_grad():
            ref = _first_tensor(model(*args))
            t0 = time.perf_counter()
            pt = torch.compile(model, backend="polytile", options={"threads": threads})
            out = _first_tensor(pt(*args))
            compile_s = time.perf_counter() - t0
            st = polytile.stats()
            err = (out - ref).abs().max().item()
            fns = {"eager": lambda: model(*args), "polytile": lambda: pt(*args)}
            if inductor:
                ind = torch.compile(model)
                ind(*args)
                fns["inductor"] = lambda: ind(*args)
            t = time_side_by_side(fns, rounds=rounds)
        fallbacks = sum(st["ops_fallen_back"].values())
        rows.append([name, f"{t['eager'] * 1e3:.1f}", f"{t['inductor'] * 1e3:.1f}" if inductor else "-",
                     f"{t['polytile'] * 1e3:.1f}", f"{t['eager'] / t['polytile']:.2f}x", f"{compile_s:.1f}",
                     f"{err:.2e}", fallbacks, st["kernels_generated"]])
        print(f"done: {name}", flush=True)
    table = format_table(["model", "eager ms", "inductor ms", "polytile ms", "polytile vs eager",
                          "polytile compile s", "max abs err", "fallbacks", "kernels"], rows)
    return (f"threads={threads}, medians of {rounds} alternating calls after warm-up, torch.no_grad()\n\n"
            + table)
