"""How precisely the generator's float32 norms compute at `huge` inputs, source by source: the
verifier's comparison refused the held-out `layernorm_2d_affine` (session 11) at one element of a
131967-wide row where the bias cancels most of weight x xhat.

    python benchmarks/precision_ab.py --out DIR [--sources default,chains] [--seeds 24] \
        [--verify layernorm_hw_affine,...]

Sources: `default` (the generator's kernel), `1/sqrtf` (the same with the prelude's `rsqrtf`, within
2 ulp, replaced by `1.f / sqrtf`, two correctly rounded steps as torch's CPU layer norm), or a
schedule variant's name (`chains`: a streamed row's sums kept as one partial per chunk in flight).
For each spec (tests/builtin_specs/layernorm_hw_affine.yaml and the development suite's float32
norms) every source is launched on the same cases (every seed, `huge` and `normal` inputs, the
held-out problem's failing width and odd ones) and each output compared with the float64 truth as
the verifier compares (verify/compare.py); each source is timed at a looped wide-row shape and at
the spec's benchmark shape. --verify names the specs whose sources also go through the verifier
(seed 0). Writes DIR/precision_ab.json and prints a line per (spec, source).

Session 13 (H200, call 1, as rsqrt_ab.py): `1/sqrtf` changed nothing (layernorm_hw_affine refused at
19/72 `huge` cases with rsqrtf, 21/72 with 1/sqrtf, all at the 131967 width; the non-affine norms
at the same widths 0): the rsqrt is not the cause; the row sums' sequential chains are the suspect.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from decode_ab import device_us_per_call, launcher_for  # noqa: E402
from variant_ab import compile_all  # noqa: E402
from specgen.agents.builtin.generator import build_source  # noqa: E402
from specgen.agents.builtin.prelude import PRELUDE  # noqa: E402
from specgen.agents.builtin.schedule import variant_named  # noqa: E402
from specgen.fsutil import write_atomic  # noqa: E402
from specgen.spec import load_spec  # noqa: E402
from specgen.verify.compare import compare  # noqa: E402
from specgen.verify.data import prepare  # noqa: E402
from specgen.verify.library import KernelLibrary  # noqa: E402
from specgen.verify.strategies import make_case  # noqa: E402

NOW = "__device__ __forceinline__ float rsqrt_(float x) { return rsqrtf(x); }"
EXACT = "__device__ __forceinline__ float rsqrt_(float x) { return 1.f / sqrtf(x); }"
SPECS = {  # spec -> the shapes of its cases: the held-out problem's failing width (131967), odd ones
    "tests/builtin_specs/layernorm_hw_affine.yaml": [{"B": 2, "H": 129, "W": 1023}, {"B": 2, "H": 255, "W": 253},
                                                     {"B": 3, "H": 7, "W": 33}],
    "benchmarks/level1/specs/layernorm_module.yaml": [{"B": 2, "C": 3, "H": 129, "W": 341},
                                                      {"B": 2, "C": 5, "H": 7, "W": 9}],
    "benchmarks/level1/specs/rmsnorm_channels.yaml": [{"B": 2, "C": 63, "H": 31, "W": 33}],
    "benchmarks/level1/specs/instance_norm.yaml": [{"B": 2, "C": 3, "H": 255, "W": 253}, {"B": 2, "C": 3, "H": 9, "W": 7}],
    "benchmarks/level1/specs/groupnorm_module.yaml": [{"B": 2, "G": 3, "H": 65, "W": 63}],
}


def refusals(spec, lib, shapes, seeds: int) -> dict:
    counts = {"huge": [0, 0], "normal": [0, 0]}  # refused, cases
    first = []
    for dims in shapes:
        for seed in range(seeds):
            for distribution in counts:
                data = prepare(spec, make_case(dims, "float32", seed=seed, distribution=distribution), "forward")
                launch, outs = launcher_for(lib, data, "forward")
                code = launch()
                torch.cuda.synchronize()
                bad = [k for k, t in data.truth.items() if code or
                       compare(outs[k], t, data.atol[k], data.rtol, data.reference.get(k)) is not None]
                counts[distribution][1] += 1
                if bad:
                    counts[distribution][0] += 1
                    if len(first) < 3:
                        first.append({"dims": dims, "seed": seed, "distribution": distribution, "outputs": bad})
    return {"counts": counts, "first_refusals": first}


def timing(spec, lib, dims: dict) -> float:
    data = prepare(spec, make_case(dims, "float32", seed=0), "forward")
    return device_us_per_call(launcher_for(lib, data, "forward")[0], calls=20)


def source_named(spec, name: str) -> str:
    if name == "1/sqrtf":
        return build_source(spec).replace(NOW, EXACT)
    return build_source(spec, variant_named(name))


def wide(shapes: list[dict], spec) -> dict:
    """A timed shape of ~64 rows as wide as the widest case row (the looped pass)."""
    dims = dict(max(shapes, key=lambda d: sum(d.values())))
    first = spec.signature.inputs[0].type.dims[0].symbol
    dims[first] = 64 if first in ("B",) else dims[first]
    return dims


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", type=int, default=24)
    parser.add_argument("--sources", default="default,chains")
    parser.add_argument("--verify", default="layernorm_hw_affine",
                        help="comma-separated spec names whose sources also go through the verifier ('' none)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("precision_ab: no CUDA GPU")
        return 3
    assert NOW in PRELUDE, "the prelude's rsqrt_ changed: update precision_ab.py"
    sources = {}
    for path in SPECS:
        spec = load_spec(REPO / path)
        for which in args.sources.split(","):
            try:
                sources[(spec.name, which)] = (spec, source_named(spec, which))
            except Exception as error:  # refused: nothing to compare
                print(f"precision_ab: {spec.name} {which}: {error}", file=sys.stderr)
    libs = compile_all(sources)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for (name, which), (spec, source) in sources.items():
        started = time.perf_counter()
        lib = KernelLibrary(spec, libs[(name, which)])
        shapes = SPECS[str(spec.path.relative_to(REPO))]
        row = {"spec": name, "source": which, **refusals(spec, lib, shapes, args.seeds), "shapes": shapes}
        row["wide_dims"] = wide(shapes, spec)
        row["wide_us"] = timing(spec, lib, row["wide_dims"])
        row["benchmark_us"] = timing(spec, lib, dict(spec.benchmark[0]))
        if name in args.verify.split(","):
            from specgen.verify import verify_kernel
            verdict = verify_kernel(spec, source)
            row["verifier"] = "PASS" if verdict.passed else f"FAIL {verdict.summary()[:300]}"
        row["seconds"] = round(time.perf_counter() - started, 1)
        rows.append(row)
        c = row["counts"]
        print(f"{name:22s} {which:8s} refused huge {c['huge'][0]}/{c['huge'][1]} normal {c['normal'][0]}/"
              f"{c['normal'][1]}  wide {row['wide_us']:8.1f} us  benchmark {row['benchmark_us']:8.1f} us  "
              f"{row.get('verifier', '')}", flush=True)
        write_atomic(args.out / "precision_ab.json", json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
