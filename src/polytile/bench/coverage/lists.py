"""Reading PyTorch 2's benchmark model lists (and ``--models-file`` lists): ``Spec``,
parsing, per-suite reading, selection."""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field

SUITES = ("hf", "timm", "torchbench")


@dataclass
class Spec:
    suite: str  # hf | timm | torchbench
    name: str
    list_batch: int | None = None  # the batch size the list gives (GPU/CPU benchmark default)
    overrides: dict = field(default_factory=dict)  # config/create_model keywords, seq_len, input_size
    source: str = ""  # the list section it came from


def default_lists_dir() -> str | None:
    """``shared/bench/pytorch2`` next to (or above) the working tree, if present."""
    from .. import zoo

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
