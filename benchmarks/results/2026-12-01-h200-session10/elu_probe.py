"""Session 10, call 3: the fast 16-bit expm1 on the GPU: elu's builtin kernel verified, then its
forward timed at 6.4/12.9 GB beside eager and aten's neg() bandwidth in the same process."""
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from level1_bench import neg_bandwidth_gbs  # noqa: E402
from specgen.agents.builtin import build_source  # noqa: E402
from specgen.agents.builtin.generator import compile_source  # noqa: E402
from specgen.bench import bench_spec  # noqa: E402
from specgen.spec import load_spec  # noqa: E402
from specgen.verify import verify_kernel  # noqa: E402

spec = load_spec(REPO / "benchmarks" / "level1" / "specs" / "elu.yaml")
source = build_source(spec)
verdict = verify_kernel(spec, source)
print("elu verify:", verdict.summary().splitlines()[0], verdict.cases, "cases", flush=True)
library = compile_source(spec, source).library
result = bench_spec(spec, library, shapes=[{"N": 4096, "D": 393216}], dtypes=["bfloat16", "float32"],
                    eager=True, compiled=False, directions=("forward",))
for row in result.rows:
    gbs = row.bytes / (row.kernel_us * 1e-6) / 1e9
    neg = neg_bandwidth_gbs(row.dtype)
    print(f"elu forward {row.dtype}: kernel {row.kernel_us:.1f} us, eager {row.eager_us:.1f} us "
          f"({row.eager_us / row.kernel_us:.2f}x eager), {gbs:.0f} GB/s = {100 * gbs / neg:.1f}% of neg() {neg:.0f} GB/s")
