"""Ahead-of-time compilation of generated Triton kernels for a GPU architecture, without a GPU.

``compile_module`` compiles each kernel of a rendered module with ``triton.compile`` for
``sm_80`` / ``sm_90a`` / ``sm_100a`` and reports what the cost model meant to get: the
tensor-core instructions in the PTX (``mma.sync`` on sm_80, ``wgmma`` on sm_90a, ``tcgen05``
on sm_100a), the shared memory a block uses and the registers, stack and local (spill)
memory that ``ptxas`` gave it (read from the cubin with ``cuobjdump -res-usage``).

Triton must have been imported without ``TRITON_INTERPRET`` (its interpreter replaces the
compiler): run it in a process of its own, ``python -m polytile.backends.gpu.aot SPEC.json``,
where SPEC lists the module path and its kernels (``spec_of``).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

CAPABILITY = {"sm_80": 80, "sm_90a": 90, "sm_100a": 100}
TENSOR_CORE = {"sm_80": "mma.sync", "sm_90a": "wgmma", "sm_100a": "tcgen05.mma"}


def spec_of(graph) -> dict:
    """What the AOT compile of a ``TritonGraph``'s kernels needs, as JSON-able data."""
    return {"module": graph.module_path,
            "kernels": [{"name": k.name, "signature": k.signature, "constexprs": k.constexprs,
                         "warps": k.plan.warps, "stages": k.plan.stages, "kind": k.plan.kind}
                        for k in graph.kernels]}


def _cubin_usage(cubin: bytes) -> dict:
    from triton.backends.nvidia.compiler import get_ptxas  # noqa: F401  (the bundled CUDA tools)
    import triton.backends.nvidia as nv

    tool = os.path.join(os.path.dirname(nv.__file__), "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    usage = {}
    for key, name in (("REG", "registers"), ("STACK", "stack_bytes"), ("LOCAL", "local_bytes")):
        m = re.search(rf"\b{key}:(\d+)", out)
        usage[name] = int(m.group(1)) if m else None
    return usage


def compile_module(spec: dict, arch: str) -> dict:
    """kernel name -> facts of its compile for ``arch``."""
    if os.environ.get("TRITON_INTERPRET", "") not in ("", "0"):
        raise RuntimeError("ahead-of-time compiles need Triton imported without TRITON_INTERPRET")
    import importlib.util

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    m = importlib.util.spec_from_file_location("polytile_aot_module", spec["module"])
    mod = importlib.util.module_from_spec(m)
    m.loader.exec_module(mod)
    facts = {}
    for k in spec["kernels"]:
        fn = getattr(mod, k["name"])
        sig = dict(k["signature"])
        sig.update({c: "constexpr" for c in k["constexprs"]})
        src = ASTSource(fn=fn, signature=sig, constexprs=dict(k["constexprs"]))
        ck = triton.compile(src, target=GPUTarget("cuda", CAPABILITY[arch], 32),
                            options={"num_warps": k["warps"], "num_stages": k["stages"]})
        ptx = ck.asm["ptx"]
        usage = _cubin_usage(ck.asm["cubin"])
        # the shared memory the block allocates (pipeline buffers included): the module's attribute
        m_shared = re.search(r'"?ttg\.shared"?\s*=\s*(\d+)', ck.asm["ttgir"])
        facts[k["name"]] = {"kind": k["kind"], "tensor_core": TENSOR_CORE[arch] in ptx, "mma_sync": "mma.sync" in ptx,
                            "shared_bytes": int(m_shared.group(1)) if m_shared else ck.metadata.shared,
                            "ptx_local_stores": ptx.count("st.local"), **usage}
    return facts


def compile_in_subprocess(spec: dict, arch: str, timeout: float = 600) -> dict:
    """``compile_module`` in a fresh Python without ``TRITON_INTERPRET``."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
    try:
        r = subprocess.run([sys.executable, "-m", "polytile.backends.gpu.aot", f.name, arch], env=env,
                           capture_output=True, text=True, timeout=timeout)
    finally:
        os.unlink(f.name)
    if r.returncode:
        raise RuntimeError(f"AOT compile failed:\n{r.stderr[-4000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    with open(sys.argv[1]) as fh:
        print(json.dumps(compile_module(json.load(fh), sys.argv[2])))
