"""Physics as a hard bound: no kernel moves bytes faster than the memory can, or does
arithmetic faster than the chip can.

The byte floor counts what must come from device memory: every byte of each input the outputs
depend on (the L2 is flushed before each timed call) and the output bytes that cannot stay in
the L2. An input the outputs do not depend on (mean's backward broadcasts its gradient; x gives
only the shape) is not counted: a correct kernel need not read it (`unread_inputs`). One the
outputs depend on only in part, where structure or integer inputs decide (`read_fractions`), is
counted at the fraction of probed elements that matter, or not at all when most do not (an NLL
loss gathers one log-probability per row: N of N x C elements, a fraction that depends on the
shape; an LM loss over logits[:, :-1] needs all but one position in T). So is a gather at indices
computed from values (logp.gather(1, s.argmax(1))): the same count read in every draw, whichever
elements; values that mask (ReLU's backward) keep the input counted in full. Its rate is the
HBM's theoretical peak (from the memory clock and bus width the driver reports; 4.8 TB/s on
an H200 when unknown), not a measured copy: aten's elementwise kernels reach about 102% of a
device-to-device copy on an H200, so a copy is no ceiling. The FLOP floor counts the matrix
products of the reference (torch's FlopCounterMode) at the dtype's dense tensor-core peak.
A time under either floor, even with PHYSICS_MARGIN to spare, means work was skipped or done
outside the timed region: the candidate is rejected.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from .. import abi
from ..inputs import TORCH_DTYPES

DEFAULT_HBM_GBS = 4800.0  # H200 datasheet
PHYSICS_MARGIN = 1.05  # a time may beat the peak by rounding only: 5% above it rejects
# Dense tensor-core peaks of an H100/H200 SXM (FLOP/s), by working dtype; float32 counts as TF32.
DENSE_PEAK_FLOPS = {"bfloat16": 989.5e12, "float16": 989.5e12, "float32": 494.7e12, "float64": 66.9e12}


@functools.lru_cache(maxsize=4)
def hbm_peak_gbs(device_index: int = 0) -> float:
    """Theoretical HBM bandwidth, GB/s: 2 transfers per memory clock over the whole bus."""
    try:
        props = torch.cuda.get_device_properties(device_index)
        clock_khz = getattr(props, "memory_clock_rate", 0)
        bus_bits = getattr(props, "memory_bus_width", 0)
        if clock_khz and bus_bits:
            return max(2 * clock_khz * 1e3 * bus_bits / 8 / 1e9, 1.0)
    except Exception:  # noqa: BLE001 - no device properties: the datasheet number
        pass
    return DEFAULT_HBM_GBS


@functools.lru_cache(maxsize=4)
def l2_bytes(device_index: int = 0) -> int:
    try:
        return int(getattr(torch.cuda.get_device_properties(device_index), "L2_cache_size", 0) or 0)
    except Exception:  # noqa: BLE001
        return 0


@dataclass
class Floor:
    bytes_counted: int
    flops: float
    peak_gbs: float
    peak_flops: float | None

    @property
    def us(self) -> float:
        """The least time any correct kernel can take, in microseconds."""
        by_bytes = self.bytes_counted / (self.peak_gbs * 1e9) * 1e6
        by_flops = self.flops / self.peak_flops * 1e6 if self.peak_flops and self.flops else 0.0
        return max(by_bytes, by_flops)

    def describe(self) -> str:
        text = f"{self.bytes_counted / 1e6:.1f} MB at the HBM peak of {self.peak_gbs:.0f} GB/s"
        if self.flops and self.peak_flops:
            text += f", {self.flops / 1e9:.2f} GFLOP at {self.peak_flops / 1e12:.0f} TFLOP/s"
        return text


def tensor_bytes(spec, dims: dict, dtype: str, direction: str, unread: frozenset = frozenset(),
                 fractions: dict | None = None) -> tuple[int, int]:
    """(bytes read, bytes written) by one call of `direction`, from its ABI fields; the fields in
    `unread` (see unread_inputs) are not counted, those in `fractions` (read_fractions) at that
    fraction of their bytes."""
    read = written = 0
    for f in abi.fields(spec, direction):
        if not f.is_tensor or f.name in unread:
            continue
        itemsize = torch.empty((), dtype=TORCH_DTYPES[f.tensor.dtype_for(dtype)]).element_size()
        nbytes = int(math.prod(f.tensor.shape(dims)) * itemsize * (fractions or {}).get(f.name, 1.0))
        if f.written:
            written += nbytes
        elif direction == "forward" or f.role != "fwd_output":  # a backward needs y or x, not both
            read += nbytes
    return read, written


def reference_flops(spec, dims: dict, dtype: str, direction: str) -> float:
    """Matrix-product FLOPs of the reference (0 for elementwise and reductions), on meta tensors."""
    try:
        from torch.utils.flop_counter import FlopCounterMode

        from ..inputs import default_scalar

        args = {}
        for p in spec.signature.params:
            if p.is_tensor:
                args[p.name] = torch.empty(p.type.shape(dims), dtype=TORCH_DTYPES[p.type.dtype_for(dtype)],
                                           device="meta", requires_grad=direction == "backward"
                                           and p.type.differentiable)
            else:
                args[p.name] = default_scalar(p)
        counter = FlopCounterMode(display=False)
        with counter:
            out = spec.reference_fn()(**args)
            if direction == "backward":
                outs = out if isinstance(out, (tuple, list)) else (out,)
                grads = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
                if grads:
                    torch.autograd.backward(grads, [torch.empty_like(o) for o in grads])
        total = float(counter.get_total_flops())
        if direction == "backward":  # the counter saw forward + backward
            forward = reference_flops(spec, dims, dtype, "forward")
            total = max(total - forward, 0.0)
        return total
    except Exception:  # noqa: BLE001 - a reference meta tensors cannot run: no FLOP floor
        return 0.0


PROBE_SEEDS = (7, 13)  # redraws of one input at a time; both must leave every output unchanged
PROBE_ELEMENTS = 16  # elements of a floating input set, one at a time, to each of PROBE_VALUES
MOSTLY_IGNORED = 0.75  # of the probed elements: the input is read like a gather, counted not at all
PROBE_VALUES = (float("nan"), 1e30, -1e30)  # NaN propagates through arithmetic, +-1e30 through max/min/fmax
# Where values decide which elements are read (a gather at s.argmax(1)): every element probed, at
# every dim near VALUE_PROBE_SIZE and then twice it, for an input of at most VALUE_PROBE_ELEMENTS
# there (each element costs up to three reference runs; a larger one is counted in full)
VALUE_PROBE_SIZE, VALUE_PROBE_ELEMENTS = 8, 1024


def read_fractions(spec, direction: str) -> dict[str, float]:
    """{drawn field: the fraction of its bytes the floor counts} for those not counted in full:
    0.0 for unread_inputs, else 1 - the fraction of probed elements the outputs ignore (a
    structural partial read of fewer than MOSTLY_IGNORED of them, _ignored_share)."""
    key = (spec.hash(), direction, "fractions")
    if key not in _UNREAD:
        unread_inputs(spec, direction)
    return _UNREAD[key]


def unread_inputs(spec, direction: str) -> frozenset:
    """The drawn ABI fields of `direction` (inputs, output gradients) a correct kernel need not
    read in full, on the spec's small first case, on the CPU: those whose values no output
    depends on (drawn again alone, twice, they leave every output of the reference bit for bit
    unchanged), and floating ones the outputs depend on only in part, where the op's structure
    or its integer inputs decide, or its structure how many and the values which (`_ignored_share`:
    a gather). Empty when the probe cannot run (every input counted)."""
    key = (spec.hash(), direction)
    if key not in _UNREAD:
        try:
            fractions = _probe_reads(spec, direction)
        except Exception:  # noqa: BLE001 - the reference misbehaves here: count every input
            fractions = {}
        _UNREAD[key] = frozenset(name for name, f in fractions.items() if f == 0.0)
        _UNREAD[(*key, "fractions")] = {name: f for name, f in fractions.items() if f > 0.0}
    return _UNREAD[key]


_UNREAD: dict = {}


def _prepared(spec, case, direction: str) -> tuple:
    """(the case prepared on the CPU, its truth, the inputs of PROBE_SEEDS redraws of it)."""
    from dataclasses import replace

    from .data import prepare

    base = prepare(spec, case, direction, "cpu", later=True)
    truth, _ = base.derive(base.inputs)
    redraws = [prepare(spec, replace(case, seed=case.seed + k), direction, "cpu", later=True).inputs
               for k in PROBE_SEEDS]
    return base, truth, redraws


def _probe_reads(spec, direction: str) -> dict[str, float]:
    from .strategies import smoke_case

    case = smoke_case(spec)
    base, truth, redraws = _prepared(spec, case, direction)
    fractions: dict[str, float] = {}
    drawn = {f.name for f in abi.fields(spec, direction) if f.role in ("input", "grad_output")}  # not derived ones
    for name, tensor in base.inputs.items():
        if name not in drawn:
            continue
        others = [r[name] for r in redraws if name in r and r[name].shape == tensor.shape
                  and not torch.equal(r[name], tensor)]
        if len(others) < len(PROBE_SEEDS):
            continue  # not redrawn differently (a constant, an empty tensor): counted
        if all(_same(truth, base.derive({**base.inputs, name: other})[0]) for other in others):
            fractions[name] = 0.0
        elif tensor.is_floating_point() and (ignored := _ignored_share(spec, case, direction, name, base, truth,
                                                                       redraws)):
            fractions[name] = 0.0 if ignored >= MOSTLY_IGNORED else 1.0 - ignored
    return fractions


def _ignored_share(spec, case, direction: str, name: str, base, truth: dict, redraws: list[dict]) -> float:
    """The share of floating input `name` a correct kernel need not read (0.0: counted in full):
    where structure or integer inputs decide (_ignored_in_part), the probed share, or a gather's
    1.0 when that share grows with the shape; where the values of the inputs decide, what
    _ignored_where_values_decide establishes."""
    ignored = _ignored_in_part(base, truth, redraws, name)
    if ignored is None:
        try:
            return _ignored_where_values_decide(spec, case, direction, name)
        except Exception:  # noqa: BLE001 - the reference fails at the small probe shapes: this one counted
            return 0.0
    if 0.0 < ignored < MOSTLY_IGNORED:  # the same probe at twice the sizes: an ignored share
        twice = _ignored_at_twice(spec, case, direction, name) or 0.0  # that grows with the shape
        ignored = 1.0 if twice > ignored + 1.0 / PROBE_ELEMENTS else max(ignored, twice)  # is a gather's
    return ignored


def _resized(spec, case, size):
    """`case` with every dim at `size(its dim)`, made legal (its range, its divisor)."""
    from dataclasses import replace

    from .strategies import legal_sizes

    steps = spec.signature.symbol_divisors()
    dims = {s: legal_sizes(*spec.dims[s], steps.get(s, 1), [size(v)])[0] for s, v in case.dim_map.items()}
    return replace(case, dims=tuple(dims.items()))


def _ignored_at_twice(spec, case, direction: str, name: str) -> float | None:
    """The ignored share of `name`'s probed elements with every dim twice the first case's (within
    its range): `x[:, :20]` needs 20 of 37 elements a row there and 20 of 74 here, so a share
    measured at one small shape would count far too much at the benchmark's."""
    return _ignored_in_part(*_prepared(spec, _resized(spec, case, lambda v: 2 * v), direction), name)


def _ignored_in_part(base, truth: dict, redraws: list[dict], name: str) -> float | None:
    """The fraction of probed elements of input `name` that change no output whatever their
    value, the same ones under every redraw of the floating inputs (integer inputs kept): the op
    reads `name` where its structure or its indices decide (a gather, an exclusive scan's last
    element). None where the ignored elements move with the values (ReLU's backward ignores
    grad_out where y <= 0; a gather at s.argmax(1)): _ignored_where_values_decide."""
    ignored = _ignored_elements(base.inputs, truth, name, base.derive)
    if not ignored:
        return 0.0
    for redraw in redraws:
        inputs = {k: (v if v.is_floating_point() else base.inputs[k]) for k, v in redraw.items()}
        if _ignored_elements(inputs, base.derive(inputs)[0], name, base.derive) != ignored:
            return None
    return len(ignored) / len(_probe_positions(base.inputs[name].numel()))


def _ignored_where_values_decide(spec, case, direction: str, name: str) -> float:
    """Where the values decide which elements of `name` the outputs read: the share ignored when
    every element, probed, shows that the structure decides how many are read (a gather at
    s.argmax(1) reads one a row, whichever it is): as many ignored in every draw, mostly ignored,
    or a read share that halves when every dim doubles (a count fixed per row). Else 0.0, counted
    in full: values that mask (ReLU's backward ignores grad_out where x <= 0, as many as the draw
    has) leave a kernel reading nearly every 32-byte sector, and a share that neither stays high
    nor halves says nothing of the benchmark's shape."""
    small = _exact_ignored_share(spec, _resized(spec, case, lambda v: VALUE_PROBE_SIZE), direction, name)
    if small is None or small >= MOSTLY_IGNORED:
        return small or 0.0
    twice = _exact_ignored_share(spec, _resized(spec, case, lambda v: 2 * VALUE_PROBE_SIZE), direction, name)
    halves = twice is not None and 1.0 - twice <= (1.0 - small) / 2 + 1e-9
    return 1.0 if small > 0.0 and halves else 0.0


def _exact_ignored_share(spec, case, direction: str, name: str) -> float | None:
    """The share of `name`'s elements, each probed, that no output depends on in `case` and in its
    redraws (every input redrawn), when it is the same in each; None when it is not, or when
    `name` has more than VALUE_PROBE_ELEMENTS elements there."""
    base, truth, redraws = _prepared(spec, case, direction)
    count = base.inputs[name].numel()
    if not count or count > VALUE_PROBE_ELEMENTS:
        return None
    every = range(count)
    ignored = len(_ignored_elements(base.inputs, truth, name, base.derive, every))
    for redraw in redraws:  # stop at the first draw that differs: values decide how many
        if len(_ignored_elements(redraw, base.derive(redraw)[0], name, base.derive, every)) != ignored:
            return None
    return ignored / count


def _ignored_elements(inputs: dict, truth: dict, name: str, derive, positions=None) -> frozenset:
    """The flat indices of `name` among `positions` (default: the probed ones, _probe_positions)
    that no value of PROBE_VALUES moves any output from `truth`."""
    tensor = inputs[name]
    ignored = set()
    for flat in (_probe_positions(tensor.numel()) if positions is None else positions):
        for value in PROBE_VALUES:
            probed = tensor.clone()
            probed.view(-1)[flat] = value
            if not _same(truth, derive({**inputs, name: probed})[0]):
                break
        else:
            ignored.add(flat)
    return frozenset(ignored)


def _probe_positions(count: int) -> list[int]:
    """PROBE_ELEMENTS flat indices spread evenly over `count` elements, the first and last among them."""
    return sorted({round(k * (count - 1) / max(PROBE_ELEMENTS - 1, 1)) for k in range(PROBE_ELEMENTS)}) if count else []


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k].nan_to_num(0.0), b[k].nan_to_num(0.0))
                                        and torch.equal(a[k].isnan(), b[k].isnan()) for k in a)


def floor(spec, dims: dict, dtype: str, direction: str, device_index: int = 0) -> Floor:
    read, written = tensor_bytes(spec, dims, dtype, direction, unread_inputs(spec, direction),
                                 read_fractions(spec, direction))
    counted = read + max(0, written - l2_bytes(device_index))
    flops = reference_flops(spec, dims, dtype, direction)
    return Floor(counted, flops, hbm_peak_gbs(device_index), DENSE_PEAK_FLOPS.get(dtype))


def violation(measured_us: float, bound: Floor) -> str | None:
    """Why a measured time is impossible, or None."""
    if measured_us <= 0:
        return f"a time of {measured_us:.3f} us is not a measurement of work"
    if measured_us * PHYSICS_MARGIN < bound.us:
        return (f"{measured_us:.2f} us is faster than physics allows: moving {bound.describe()} takes at least "
                f"{bound.us:.2f} us (the bound rejects anything {PHYSICS_MARGIN:.2f}x faster). The kernel skips "
                f"work or does it outside the timed call")
    return None
