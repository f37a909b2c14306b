"""swiglu_a's forward: where its global loads sit relative to the programmatic-dependent-launch wait,
in the PTX nvcc generates for it (the compile's own flags: -O3, sm_90).

Spoiler: reading this file or its output spoils the suite.

A PDL secondary may start while the previous kernel in the stream still runs; only loads issued after
`griddepcontrol.wait` are guaranteed to see that kernel's writes (CUDA programming guide, "Programmatic
Dependent Launch"; CCCL's review rule correctness.pdl-sync; the fix "Load upstream-produced inputs only
after gridDepSync", lightseekorg/tokenspeed#327). This prints, for every instantiation of the forward, the
order of its ld.global, griddepcontrol and st.global instructions.

    PYTHONPATH=. python3 -B heldout/attacks-v10/cpu_checks/pdl_order.py
"""
from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

SUITE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(SUITE.parents[1]))

from specgen.abi import write_header  # noqa: E402
from specgen.spec import load_spec  # noqa: E402
from specgen.toolchain.cuda import find_cuda_toolkit  # noqa: E402


def main() -> int:
    nvcc = find_cuda_toolkit().nvcc
    with tempfile.TemporaryDirectory() as tmp:
        write_header(load_spec(SUITE / "specs" / "swiglu.yaml"), tmp)
        ptx = Path(tmp) / "swiglu_a.ptx"
        subprocess.run([str(nvcc), "-ptx", "-O3", "-std=c++17", "-arch=sm_90", f"-I{tmp}", str(SUITE / "swiglu_a.cu"),
                        "-o", str(ptx)], check=True)
        text = ptx.read_text()
    entries = re.split(r"^\.entry ", text, flags=re.M)[1:]
    bad = 0
    for entry in entries:
        name = entry.split("(", 1)[0]
        ops = [m.group(0) for m in re.finditer(r"ld\.global[\w.]*|st\.global[\w.]*|griddepcontrol\.\w+", entry)]
        if not any(o.startswith("griddepcontrol") for o in ops):
            print(f"{name[:90]}: no PDL instruction (launched normally)")
            continue
        wait = ops.index("griddepcontrol.wait")
        before = [o for o in ops[:wait] if o.startswith("ld.global")]
        stores_before = [o for o in ops[:wait] if o.startswith("st.global")]
        print(f"{name[:90]}: {len(before)} global load(s) before griddepcontrol.wait, {len(stores_before)} store(s); "
              f"sequence {' '.join(o.split('.')[0] + '.' + o.split('.')[1] for o in ops)}")
        bad += bool(before)
    print(f"\n{bad} forward instantiation(s) load x before the PDL wait")
    return 0


if __name__ == "__main__":
    sys.exit(main())
