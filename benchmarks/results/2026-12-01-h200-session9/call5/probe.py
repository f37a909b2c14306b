"""Session 9, last call: (1) decode rows of two reductions with a split-row workspace, now that the
candidate's process keeps the default pool's freed memory (call 2: bce forward N=8 D=4096 105 us,
argmax dim1 B=8 C=64 S=1024 57 us); (2) the held-out batchnorm1d_train_module default variant
through the verifier (call 2: remembers-inputs, 144.5 us fresh vs 41.2 us cadence)."""
import json
import sys
import time
from pathlib import Path

from specgen.agents.builtin.generator import compile_source, generate_builtin
from specgen.bench import bench_spec
from specgen.spec import load_spec
from specgen.verify import verify_kernel

out = {"bench": [], "verify": []}
for path, shapes in (("benchmarks/level1/specs/bce_with_logits_loss.yaml", [{"N": 8, "D": 4096}]),
                     ("benchmarks/level1/specs/argmax_dim1.yaml", [{"B": 8, "C": 64, "S": 1024}])):
    spec = load_spec(path)
    source = generate_builtin(spec, gpu=False, write=False).source
    library = compile_source(spec, source).library
    directions = ("forward", "backward") if spec.backward == "kernel" else ("forward",)
    result = bench_spec(spec, library, shapes=shapes, compiled=False, directions=directions)
    for r in result.rows:
        row = {"op": spec.name, "dims": r.dims, "dtype": r.dtype, "direction": r.direction,
               "kernel_us": r.kernel_us, "eager_us": r.eager_us, "rejected": result.rejected}
        out["bench"].append(row)
        print("bench", json.dumps(row))
spec = load_spec("heldout/problems/batchnorm1d_train_module.yaml")
source = generate_builtin(spec, gpu=False, write=False).source
started = time.time()
verdict = verify_kernel(spec, source)
row = {"op": spec.name, "reason": verdict.reason, "detail": verdict.detail[:600], "timings": verdict.timings,
       "seconds": round(time.time() - started, 1)}
out["verify"].append(row)
print("verify", json.dumps(row, default=str)[:1200])
Path(sys.argv[1]).write_text(json.dumps(out, indent=2, default=str) + "\n")
