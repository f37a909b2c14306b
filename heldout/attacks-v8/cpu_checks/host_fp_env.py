"""Run from the repository root (needs nvcc, no GPU): python -B heldout/attacks-v8/cpu_checks/host_fp_env.py

gelu_tanh_host_fp_env.cu compiled as specgen compiles it (static_checks: it passes them), loaded with
ctypes and its forward called once on a machine without a GPU (the launch fails; the host code before
it runs). Python's own float arithmetic on a subnormal, before and after the call."""
import ctypes
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(REPO))

from specgen import abi  # noqa: E402
from specgen.spec import load_spec  # noqa: E402
from specgen.verify import static_checks  # noqa: E402

spec = load_spec(HERE.parent / "specs" / "gelu_tanh.yaml")
with tempfile.TemporaryDirectory() as cache:
    verdict, compiled = static_checks(spec, HERE.parent / "gelu_tanh_host_fp_env.cu", arch="sm_90", cache_dir=Path(cache))
    print("static checks:", "refused: " + verdict.reason if verdict else "passed")
    lib = ctypes.CDLL(str(compiled.library))
    args = abi.ctypes_struct(spec, "forward")()
    args.N, args.D = 4, 4
    tiny = 5e-324
    print("before the call: 5e-324 * 1.0 =", tiny * 1.0, "; 2.2250738585072014e-308 / 4 =", 2.2250738585072014e-308 / 4)
    entry = lib.gelu_tanh_forward
    entry.restype, entry.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p]
    print("the call returned cudaError", entry(ctypes.addressof(args), None), "(no GPU here)")
    print("after the call:  5e-324 * 1.0 =", tiny * 1.0, "; 2.2250738585072014e-308 / 4 =", 2.2250738585072014e-308 / 4)
