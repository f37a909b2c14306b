"""Which cases the verifier (this checkout) makes, for the attacks that aim at shapes and dtypes
it does not draw. CPU only: the case lists are pure functions of the spec."""
import pathlib as _pl
_HERE = _pl.Path(__file__).resolve().parent
_REPO = _HERE.parents[2]

import math, sys
sys.path.insert(0, str(_REPO))
from specgen.spec import load_spec
from specgen.verify.strategies import (boundary_cases, full_size_cases, large_case, DEFAULT_BUDGET_ELEMENTS)
from specgen.verify.engine import Session, Options
S = str(_REPO / 'heldout/attacks-v6/specs') + '/'

def sess(spec):
    return Session(spec, None, Options(), lambda t: None, device='cpu')

# cross_entropy: side-by-side dtypes, largest N x C
ce = load_spec(S + 'cross_entropy.yaml')
s = sess(ce)
pairs = [large_case(ce, DEFAULT_BUDGET_ELEMENTS, 7)] + s.launch_bound_cases()
print('cross_entropy side by side / model loop cases:', [(c.dim_map, c.dtype) for c in pairs])
full = full_size_cases(ce, 500)
most = max(math.prod(c.dim_map.values()) for c in full)
print('cross_entropy full-size cases:', [(c.dim_map, c.dtype) for c in full])
print(f'  largest N x C = {most} (2^31 = {2**31}); any in (2^31, 2^32]:',
      any(2**31 < math.prod(c.dim_map.values()) <= 2**32 for c in full))
b = boundary_cases(ce)
print(f'  boundary+sweep cases: {len(b)}, largest N x C = {max(math.prod(c.dim_map.values()) for c in b)}')
print('  Llama 3, 32768 tokens x 128256:', 32768 * 128256, 'in band:', 2**31 < 32768 * 128256 <= 2**32)

# add_rmsnorm: full-size cases with N x D >= 2^24 and D an odd multiple of 1024
ar = load_spec(S + 'add_rmsnorm.yaml')
full = full_size_cases(ar, 500)
print('add_rmsnorm full-size cases:', [(c.dim_map, c.dtype) for c in full])
hit = [c.dim_map for c in full if c.dim_map['N'] * c.dim_map['D'] >= 2**24 and c.dim_map['D'] % 1024 == 0
       and (c.dim_map['D'] // 1024) % 2 == 1]
print('  full-size cases on the bad path:', hit)
b = boundary_cases(ar)
print(f'  boundary+sweep: {len(b)} cases, largest N x D = {max(c.dim_map["N"] * c.dim_map["D"] for c in b)}; '
      f'large case {large_case(ar).dim_map}; widths 3072/5120/7168 walked at',
      sorted({(c.dim_map["N"], c.dim_map["D"]) for c in b if c.dim_map["D"] in (3072, 5120, 7168)}))
print('  timed shapes (benchmark):', ar.benchmark)

# swiglu: backward "specials" cases with a full 4096-pair tile
sw = load_spec(S + 'swiglu.yaml')
b = [c for c in boundary_cases(sw) if c.distribution == 'specials']
print('swiglu specials boundary cases:', len(b), 'with N*H >= 4096:', sum(c.dim_map['N'] * c.dim_map['H'] >= 4096 for c in b),
      '; P(a 4096-pair tile of specials x all finite) = 0.94^8192 =', 0.94 ** 8192)
