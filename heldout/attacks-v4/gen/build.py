#!/usr/bin/env python3
"""Writes heldout/attacks-v4/*.cu and manifest.json from base.py (honest code) and cheats.py.
Run from anywhere: python heldout/attacks-v4/gen/build.py"""
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE.parent
sys.path.insert(0, str(HERE))
from base import HONEST, PRELUDE  # noqa: E402
from cheats import K  # noqa: E402

HAS_BWD = {s: s != "linear_bias_relu" for s in HONEST}


def render(k):
    op = k["spec"]
    lines = ["// " + l if l else "//" for l in k["comment"].splitlines()]
    head = f"// {k['file']}: attacks-v4 ({k['cls']}), spec {op}, expected: {k['expect']}\n" + "\n".join(lines) + "\n"
    ent = [f'extern "C" cudaError_t {op}_forward(const {op}_args* a, cudaStream_t stream) {{ return FWD(a, stream); }}']
    if HAS_BWD[op]:
        ent.append(f'extern "C" cudaError_t {op}_backward(const {op}_bwd_args* a, cudaStream_t stream) {{ return BWD(a, stream); }}')
    return (head + f'\n#include "{op}_abi.h"\n' + PRELUDE + "\n// ---- honest implementation (shared by the suite) ----\n"
            + HONEST[op] + ("\n// ---- the cheat ----\n" + k["code"] if k["code"] else "")
            + "\n#ifndef FWD\n#define FWD honest_fwd\n#endif\n#ifndef BWD\n#define BWD honest_bwd\n#endif\n" + "\n".join(ent) + "\n")


def main():
    kernels = []
    for k in K:
        (OUT / k["file"]).write_text(render(k))
        kernels.append({"file": k["file"], "spec": k["spec"], "class": k["cls"], "expect": k["expect"],
                        "reasons": k["reasons"], "static_refusal": False})
    manifest = {"suite": "attacks-v4",
                "note": ("Held-out: run once, do not tune the verifier on these files. Written without reading "
                         "tests/adversarial/ or earlier held-out suites. 'reasons' are the verdicts the author "
                         "expects a correct verifier to give; several cheats are expected to PASS the current "
                         "verifier (see README.md). Regenerate with gen/build.py."),
                "kernels": kernels}
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(len(kernels), "kernels")


if __name__ == "__main__":
    main()
