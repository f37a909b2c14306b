"""softmax_masked_block_nan: the kernel's eight warp partials and its merge tree, on a causal
attention mask (-inf above the diagonal) and on the verifier's value classes (CPU)."""
import pathlib as _pl
_HERE = _pl.Path(__file__).resolve().parent
_REPO = _HERE.parents[2]

import sys, math
sys.path.insert(0, str(_REPO)); sys.path.insert(0, str(_HERE))
import torch
from specgen.inputs import _values, DISTRIBUTIONS
from emul import ms_row
INF = float('inf')

def plain(a, b):
    m = max(a[0], b[0])
    return (m, a[1] * math.exp(a[0] - m) + b[1] * math.exp(b[0] - m)) if m != -INF else (m, float('nan'))

def nan_rows(x):  # rows of x (float32, D >= 8192) that the plain merge of warp partials turns into NaN
    N, D = x.shape
    seg = -(-D // 8)
    bad = []
    for r in range(N):
        parts = []
        for w in range(8):
            m, s = ms_row(x[r:r + 1, w * seg:min(D, (w + 1) * seg)])
            parts.append((float(m[0]), float(s[0])))
        width = 1
        while width < 8:
            for w in range(0, 8 - width, 2 * width):
                parts[w] = plain(parts[w], parts[w + width])
            width *= 2
        truth_nan = bool(torch.isnan(torch.softmax(x[r].double(), -1)).any())
        if math.isnan(parts[0][1]) and not truth_nan:
            bad.append(r)
    return bad

D = 8192
scores = torch.randn(D, D)
causal = scores.masked_fill(torch.ones(D, D, dtype=torch.bool).triu(1), -INF)
rows = list(range(0, D, 64))
bad = nan_rows(causal[rows])
print(f'causal mask, D={D}: {len(bad)} of {len(rows)} sampled query rows NaN where torch is finite (rows {rows[bad[0]]}..{rows[bad[-1]]})')
gen = torch.Generator().manual_seed(1)
for dist in DISTRIBUTIONS:
    x = _values((64, D), dist, gen, 'float32').float()
    print(f'  {dist:10s}: rows turned NaN by the plain merge: {len(nan_rows(x))} of 64')
print('P(an eighth of a row of 8192 all -inf or NaN, "specials": 4% of elements) = 0.04^1024 =', 0.04 ** 1024)
