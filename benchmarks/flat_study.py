"""Why is a flat pointwise kernel slow? Times the built-in generator's flat kernel of a spec
under several launch shapes (chunks in flight per thread x waves of resident blocks), two
ways: plainly (torch tensors, CUDA events around each call, L2 flushed) and through the
verifier's timed harness (`specgen.bench.bench_spec`, the kernel in its own process), beside
eager PyTorch on the same inputs. GPU only.

    python benchmarks/flat_study.py SPEC.yaml [--shape N=4096,D=4096] [--out study.json]

Measured on the H200 (session 7): the imported residual SiLU ran at 13-27% of the copy
bandwidth in `specgen bench`, while eager's three kernels together reached more.
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specgen import abi  # noqa: E402
from specgen.agents.builtin.generator import build_source, compile_many  # noqa: E402
from specgen.agents.builtin.schedule import Variant  # noqa: E402
from specgen.bench import bench_inputs, bench_spec, copy_bandwidth_gbs, moved_bytes, time_callable  # noqa: E402
from specgen.spec import load_spec  # noqa: E402
from specgen.verify.library import KernelLibrary  # noqa: E402

LAUNCH_SHAPES = [(4, 1), (2, 1), (4, 4), (4, 16), (2, 32), (1, 64), (8, 1), (1, 4096), (2, 4096)]
# (flat_unroll, flat_waves); (1, 4096): no cap in practice, aten's grid (a block per 128-256 chunks,
# no striding loop); (2, 4096): that grid with two chunks a thread, as aten's float32 kernel takes
# them (two 16-byte loads in flight, then ~40 instructions an element for log-sigmoid: session 17)


def plain_time_us(fn) -> float:
    """Median device time of fn() by CUDA events, the L2 flushed before each (specgen.bench's
    own timing of eager and torch.compile)."""
    return time_callable(fn, warmup=3, reps=30).median_us


def plain_kernel_call(spec, library: KernelLibrary, dims: dict, dtype: str):
    args = bench_inputs(spec, dims, dtype, seed=0)
    tensors = {k: v for k, v in args.items() if isinstance(v, torch.Tensor)}
    scalars = {k: v for k, v in args.items() if not isinstance(v, torch.Tensor)}
    for field in abi.fields(spec, "forward"):
        if field.role == "output":
            tensors[field.name] = torch.empty(field.tensor.shape(dims), device="cuda",
                                              dtype=next(iter(tensors.values())).dtype)
    stream = torch.cuda.current_stream()
    need = library.workspace_bytes("forward", tensors, scalars, dims)
    if need:  # the kernel's scratch, as the package's binding hands it over
        tensors[abi.WORKSPACE] = torch.empty(need, dtype=torch.uint8, device="cuda")

    def call():
        code = library.call("forward", tensors, scalars, dims, stream)
        if code:
            raise RuntimeError(f"kernel error {code}")
    return call, args


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("spec")
    parser.add_argument("--shape", default="")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--out", default="")
    parser.add_argument("--harness", default="u4w1,u2w32", help="variants also timed through the verifier's harness")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("flat_study: needs a CUDA GPU")
        return 3
    spec = load_spec(args.spec)
    dims = ({k: int(v) for k, v in (p.split("=") for p in args.shape.split(","))} if args.shape
            else dict(spec.benchmark[0]))
    copy = copy_bandwidth_gbs()
    rows = []
    variants = [Variant(f"u{unroll}w{waves}", flat_unroll=unroll, flat_waves=waves) for unroll, waves in LAUNCH_SHAPES]
    libraries = compile_many([(spec, build_source(spec, v)) for v in variants])  # nvcc in parallel
    for variant, compiled in zip(variants, libraries):
        if isinstance(compiled, Exception):
            print(f"{variant.name}: did not compile: {compiled}")
            continue
        path = Path(compiled.library)
        library = KernelLibrary(spec, path)
        for dtype in args.dtypes.split(","):
            call, inputs = plain_kernel_call(spec, library, dims, dtype)
            plain = plain_time_us(call)
            reference = spec.reference_fn()
            with torch.no_grad():
                eager = plain_time_us(functools.partial(reference, **inputs))
                # aten's own copy-like elementwise kernel on the same bytes: issue 12's bar for
                # pointwise kernels at >= 1 GB is 98% of its bandwidth (a copy is not the ceiling)
                first = next(v for v in inputs.values() if isinstance(v, torch.Tensor))
                neg = plain_time_us(first.neg)
            harness_us = None
            if variant.name in args.harness.split(","):  # each is a kernel process of its own: seconds
                harness = bench_spec(spec, path, shapes=[dims], dtypes=[dtype], compiled=False, eager=False)
                harness_us = harness.rows[0].kernel_us if harness.rows else None
            nbytes = moved_bytes(spec, dims, dtype)
            row = {"variant": variant.name, "dtype": dtype, "dims": dims, "MB": nbytes / 1e6,
                   "plain_us": plain, "harness_us": harness_us, "eager_us": eager, "neg_us": neg,
                   "plain_of_copy": nbytes / (plain * 1e-6) / (copy * 1e9), "plain_of_neg": neg / plain}
            rows.append(row)
            print(f"{variant.name:8} {dtype:9} plain {plain:8.1f} us ({row['plain_of_copy']:5.0%} of copy)  "
                  f"harness {harness_us or float('nan'):8.1f} us  eager {eager:8.1f} us  "
                  f"neg() {neg:8.1f} us ({row['plain_of_neg']:5.1%} of its bandwidth)", flush=True)
            del inputs, call  # the call holds its tensors: free them before the next set
            torch.cuda.empty_cache()
    if args.out:
        Path(args.out).write_text(json.dumps({"spec": spec.name, "copy_gbs": copy, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
