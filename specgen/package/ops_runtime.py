"""Registers every op of a generated package with torch.library; emitted verbatim as <package>/_ops.py.

A plain module (no template): specgen's tests import it directly (specgen.package.ops_runtime),
where it registers nothing. It knows nothing about a particular package: every per-package
value (the ops, the namespace, whether `_C` exists, which kernels are unverified, which
arguments the device checks) is data in the `_spec_data` module beside it, rendered from
specgen.package.model.

The schemas, fake (meta) kernels, the CPU path (the spec's reference) and, for ops whose
backward is not a kernel, the autograd formula live here, in Python. The compiled extension
`_C` (torch_binding.cpp, built against torch's C++ API) is the CUDA implementation of every
op with a kernel and of its backward: it checks the arguments, allocates the outputs and
launches the kernel with no Python per call, and registers the autograd of the ops whose
backward is a kernel (in C++, at the Autograd key). Its errors are RuntimeErrors worded as
the checks here. An op without a verified CUDA kernel runs its reference on CUDA too.

An op with a batch group (`x: Tensor[*B, D]`) has all of that on `<op>_rows` (the op on
[B, D]); its public `<op>` is a CompositeImplicitAutograd kernel that folds the leading dims
into B and restores them (in C++ in the binding for an op with a kernel, else here).
"""
from __future__ import annotations

import importlib
import importlib.util
import math
import warnings

import torch
from torch._subclasses.fake_tensor import FakeTensor


def _package_data():
    """The package's `_spec_data` module beside this one; None where this file is specgen's own
    specgen.package.ops_runtime (its tests use the functions; nothing is registered then)."""
    if not __package__ or importlib.util.find_spec(f"{__package__}._spec_data") is None:
        return None
    return importlib.import_module(f"{__package__}._spec_data")


_DATA = _package_data()
NAMESPACE = _DATA.NAMESPACE if _DATA else None
OPS = _DATA.OPS if _DATA else {}
ARCHS = _DATA.ARCHS if _DATA else []
TORCH_VERSION = _DATA.TORCH_VERSION if _DATA else None
LIB = torch.library.Library(NAMESPACE, "FRAGMENT") if _DATA else None
_DTYPES = {name: getattr(torch, name) for name in
           ("float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool")}


class UnverifiedKernelWarning(UserWarning):
    """A CUDA kernel of this package was not verified on a GPU (the package was built with --no-verify)."""


def reference(op_name: str):
    """The op's reference function, embedded from its spec (the package's `_reference_<op>`)."""
    return importlib.import_module(f"{__package__}._reference_{op_name}").reference


def rows_name(op):
    """The op that the reference, fake kernel, CUDA kernel and autograd are registered on:
    `<op>_rows` when `<op>` is a batch group's composite (`Tensor[*B, D]`), else `<op>`."""
    return op.get("rows", op["name"])


def _where(op, suffix=""):
    """The op as errors name it: <namespace>.<op> (the op alone outside a package); with no
    suffix, the op the checks run in (`<op>_rows` under a batch group's composite)."""
    name = f"{op['name']}{suffix}" if suffix else rows_name(op)
    return f"{NAMESPACE}.{name}" if NAMESPACE else name


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


# ---------------------------------------------------------------- checks (every path)

def size_of(dim, dims):
    symbol, mul, div, add = dim
    return add if symbol is None else dims[symbol] * mul // div + add


def resolve_dims(op, tensors, where=None):
    """Symbol values from the input shapes; every input axis is checked against them."""
    where = where or _where(op)
    dims = {}
    for spec in op["inputs"]:
        t = tensors[spec["name"]]
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{where}: {spec['name']} must be a torch.Tensor, got {type(t).__name__}")
        torch._check(t.dim() == len(spec["dims"]),
                     lambda: f"{where}: {spec['name']} must be {len(spec['dims'])}-d {_shape_text(spec)}, got shape "
                             f"{tuple(t.shape)} (signature: {op['signature']})")
    for symbol, arg, axis, mul, div, add in op["bindings"]:
        t = tensors[arg]
        scaled = (t.shape[axis] - add) * div
        torch._check(scaled % mul == 0,
                     lambda: f"{where}: {arg} axis {axis} ({t.shape[axis]}) gives no whole {symbol} "
                             f"(signature: {op['signature']})")
        dims[symbol] = scaled // mul
    for spec in op["inputs"]:
        t = tensors[spec["name"]]
        for axis, dim in enumerate(spec["dims"]):
            want = size_of(dim, dims)
            torch._check(t.shape[axis] == want,
                         lambda: f"{where}: {spec['name']} axis {axis} is {t.shape[axis]} but the other arguments "
                                 f"make it {want} (signature: {op['signature']})")
    return dims


def _shape_text(spec):
    return "[" + ", ".join(_dim_text(d) for d in spec["dims"]) + "]"


def _dim_text(dim):
    symbol, mul, div, add = dim
    if symbol is None:
        return str(add)
    text = symbol if mul == 1 else f"{mul}*{symbol}"
    text = text if div == 1 else f"{text}/{div}"
    return text if not add else f"{text}{add:+d}"


def check_dtypes(op, tensors, where=None):
    """The working dtype of the call; raises for a dtype the spec does not declare."""
    where = where or _where(op)
    working = None
    for spec in op["inputs"]:
        t = tensors[spec["name"]]
        if spec["dtype"] is None:
            if working is None:
                working, first = t.dtype, spec["name"]
                if _dtype_name(working) not in op["dtypes"]:
                    raise RuntimeError(f"{where}: {first} is {_dtype_name(working)}; supported dtypes: "
                                       f"{', '.join(op['dtypes'])}")
            elif t.dtype != working:
                raise RuntimeError(f"{where}: {spec['name']} is {_dtype_name(t.dtype)} but {first} is "
                                   f"{_dtype_name(working)}; floating arguments share one dtype")
        elif t.dtype != _DTYPES[spec["dtype"]]:
            raise RuntimeError(f"{where}: {spec['name']} must be {spec['dtype']}, got {_dtype_name(t.dtype)}")
    return working if working is not None else torch.float32


def check_call(op, tensors, where=None):
    """Shapes and dtypes (the same on every device and under fake tensors): (dims, working dtype)."""
    dims = resolve_dims(op, tensors, where)
    return dims, check_dtypes(op, tensors, where)


def check_values(op, tensors, dims, where=None):
    """Integer inputs hold values in the range the signature declares (`target: Tensor[N] int64
    in [0, C)`): the reference would index out of range, or give a number for a padding label
    (-100) the spec never defined. Real tensors only: the values of a fake tensor are unknown."""
    where = where or _where(op)
    for spec in op["inputs"]:
        if spec.get("range") is None or spec["floating"]:
            continue
        t = tensors[spec["name"]]
        if not t.numel() or isinstance(t, FakeTensor):
            continue
        lo, hi = (size_of(d, dims) for d in spec["range"])
        low, high = int(t.min()), int(t.max())
        if low < lo or high >= hi:
            bad = low if low < lo else high
            raise RuntimeError(f"{where}: {spec['name']} holds {bad}, outside [{lo}, {hi}), the range its signature "
                               f"declares; mask such entries (e.g. a padding label) before the call, or declare "
                               f"a wider range in the spec")


def check_device_contracts(synchronize: bool = True) -> None:
    """Raise the RuntimeError of an integer argument that the device check of an earlier CUDA
    call found outside the range its signature declares (e.g. a padding label -100 in a
    `target: Tensor[N] int64 in [0, C)`). The compiled CUDA path checks those values on the GPU,
    on the call's stream, without a host sync: its error is raised by the next call of a CUDA
    kernel of this package (any op, any GPU), or here. `synchronize`: first wait for the work
    queued on every initialized GPU, so that every call made so far is covered (False: only the
    checks already finished)."""
    if not (_DATA and _DATA.RANGE_SITES):
        return  # no op with a kernel has an integer input with a value range: nothing is checked on a GPU
    if not CUDA_KERNELS_LOADED:
        return
    if synchronize and torch.cuda.is_initialized():
        for device in range(torch.cuda.device_count()):
            torch.cuda.synchronize(device)
    getattr(torch.ops, NAMESPACE)._check_device_contracts()


def arch_supported(capability, archs=None) -> bool:
    """Whether code built for `archs` [(major, minor, suffix, ptx)] runs on a GPU of `capability`
    (the rule the binding's check_arch applies, per device, before a kernel runs).

    Machine code for sm_XY runs on X.Y and newer minors of X (sm_XYa: on X.Y only); PTX for
    compute_XY is compiled by the driver for X.Y and every newer GPU.
    """
    major, minor = capability
    for a_major, a_minor, suffix, ptx in (ARCHS if archs is None else archs):
        if suffix and (major, minor) == (a_major, a_minor):
            return True
        if not suffix and major == a_major and minor >= a_minor:
            return True
        if ptx and not suffix and (major, minor) >= (a_major, a_minor):
            return True
    return False


def output_dtype(spec, working):
    return working if spec["dtype"] is None else _DTYPES[spec["dtype"]]


def split_args(op, args):
    """Positional args in signature order -> ({tensor name: tensor}, [scalar values])."""
    args = list(args)
    if len(args) < len(op["params"]):  # trailing scalars left at their defaults
        defaults = {s["name"]: s["default"] for s in op["scalars"]}
        args += [defaults[name] for _, name in op["params"][len(args):]]
    tensors, scalars = {}, []
    for (kind, name), value in zip(op["params"], args):
        if kind == "tensor":
            tensors[name] = value
        else:
            scalars.append(value)
    return tensors, scalars


def join_args(op, tensors, scalars):
    scalar_values = iter(scalars)
    return [tensors[name] if kind == "tensor" else next(scalar_values) for kind, name in op["params"]]


# ---------------------------------------------------------------- CPU: the reference

def _fresh(value, tensors, dtype, device, shape, where):
    value = torch.as_tensor(value)
    if tuple(value.shape) != tuple(shape):
        raise RuntimeError(f"{where}: the reference returned shape {tuple(value.shape)}, the signature says {tuple(shape)}")
    value = value.to(device=device, dtype=dtype).contiguous()
    # custom ops may not return (views of) their inputs
    if any(t.numel() and value.numel() and t.untyped_storage().data_ptr() == value.untyped_storage().data_ptr()
           for t in tensors.values()):
        value = value.clone()
    return value


def _reference_forward(op, fn=None):
    """The op on the reference path: checks, the reference `fn` (the package's, by default),
    outputs of the declared shapes and dtypes."""
    fn = fn or reference(op["name"])

    def forward(*args):
        tensors, scalars = split_args(op, args)
        dims, working = check_call(op, tensors)
        check_values(op, tensors, dims)
        device = next(iter(tensors.values())).device
        result = fn(*join_args(op, tensors, scalars))
        result = tuple(result) if isinstance(result, (tuple, list)) else (result,)
        outs = tuple(_fresh(value, tensors, output_dtype(spec, working), device,
                            [size_of(d, dims) for d in spec["dims"]], _where(op))
                     for spec, value in zip(op["outputs"], result))
        return outs[0] if len(outs) == 1 else outs

    return forward


def _saved_values(op, tensors, scalars, dims, working):
    """The op's saved values (its spec's `saved:` definitions) for these arguments, as the
    declarations give them: a tuple in declaration order, no autograd."""
    fn = importlib.import_module(f"{__package__}._reference_{op['name']}")._specgen_saved_values
    device = next(iter(tensors.values())).device
    with torch.no_grad():
        values = fn(*join_args(op, tensors, scalars))
    return tuple(_fresh(value, tensors, output_dtype(spec, working), device,
                        [size_of(d, dims) for d in spec["dims"]], _where(op, "_fwd_saved"))
                 for spec, value in zip(op["saved"], values))


def _reference_fwd_saved(op):
    """`<op>_fwd_saved`: the outputs (the reference) and the saved values (their definitions)."""
    forward = _reference_forward(op)

    def fwd_saved(*args):
        outs = forward(*args)
        outs = outs if isinstance(outs, tuple) else (outs,)
        tensors, scalars = split_args(op, args)
        dims, working = check_call(op, tensors)
        return (*outs, *_saved_values(op, tensors, scalars, dims, working))

    return fwd_saved


def _fake_fwd_saved(op):
    def fake(*args):
        tensors, _ = split_args(op, args)
        dims, working = check_call(op, tensors)
        first = next(iter(tensors.values()))
        return tuple(first.new_empty([size_of(d, dims) for d in spec["dims"]], dtype=output_dtype(spec, working))
                     for spec in op["outputs"] + op["saved"])

    return fake


def _fake_forward(op):
    def fake(*args):
        tensors, _ = split_args(op, args)
        dims, working = check_call(op, tensors)
        first = next(iter(tensors.values()))
        outs = tuple(first.new_empty([size_of(d, dims) for d in spec["dims"]], dtype=output_dtype(spec, working))
                     for spec in op["outputs"])
        return outs[0] if len(outs) == 1 else outs

    return fake


def _split_backward_args(op, args):
    n_in, n_sc, n_out = len(op["inputs"]), len(op["scalars"]), len(op["outputs"])
    n_saved = len(op.get("saved", ()))  # the saved values follow the outputs; the reference does not read them
    tensors = {spec["name"]: t for spec, t in zip(op["inputs"], args[:n_in])}
    scalars = list(args[n_in:n_in + n_sc])
    outs = list(args[n_in + n_sc:n_in + n_sc + n_out])
    grads = list(args[n_in + n_sc + n_out + n_saved:])
    return tensors, scalars, outs, grads


def _check_backward(op, tensors, outs, grads, where):
    dims, working = check_call(op, tensors, where)
    floating = [spec for spec in op["outputs"] if spec["floating"]]
    for spec, grad in zip(floating, grads):
        want = tuple(size_of(d, dims) for d in spec["dims"])
        torch._check(tuple(grad.shape) == want,
                     lambda: f"{where}: grad_{spec['name']} has shape {tuple(grad.shape)}, the output {want}")
    return dims, working


def _reference_backward(op, fn=None):
    """Input gradients through the reference's own autograd (the spec's `backward: reference`)."""
    fn = fn or reference(op["name"])
    where = _where(op, "_backward")

    def backward(*args):
        tensors, scalars, outs, grads = _split_backward_args(op, args)
        _check_backward(op, tensors, outs, grads, where)
        with torch.enable_grad():
            leaves = {name: t.detach().requires_grad_(spec["grad"])
                      for (name, t), spec in zip(tensors.items(), op["inputs"])}
            result = fn(*join_args(op, leaves, scalars))
            result = tuple(result) if isinstance(result, (tuple, list)) else (result,)
            results = [r for r, spec in zip(result, op["outputs"]) if spec["floating"]]
            wanted = [leaves[spec["name"]] for spec in op["inputs"] if spec["grad"]]
            pairs = [(o, g.to(o.dtype)) for o, g in zip(results, grads) if o.requires_grad]
            if not pairs:
                raise RuntimeError(f"{where}: the reference recorded no autograd graph "
                                   f"(is it differentiable, and is autograd enabled here?)")
            found = torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True)
        grads_in = tuple((torch.zeros_like(w) if g is None else g).to(w.dtype).contiguous().clone()
                         for g, w in zip(found, wanted))
        return grads_in[0] if len(grads_in) == 1 else grads_in

    return backward


def _fake_backward(op):
    where = _where(op, "_backward")

    def fake(*args):
        tensors, _, outs, grads = _split_backward_args(op, args)
        _check_backward(op, tensors, outs, grads, where)
        grads = tuple(torch.empty_like(tensors[spec["name"]], memory_format=torch.contiguous_format)
                      for spec in op["inputs"] if spec["grad"])
        return grads[0] if len(grads) == 1 else grads

    return fake


# ---------------------------------------------------------------- a batch group: `Tensor[*B, D]`

def is_batched(op, spec):
    """Whether the tensor `spec` starts with the op's batch group (the starred symbol is only
    ever a first dim)."""
    return bool(op.get("batch")) and bool(spec["dims"]) and spec["dims"][0][0] == op["batch"]


def fold_batch(op, tensors, where=None):
    """The batched inputs with their leading dims folded into one axis, and those dims (`lead`,
    None when the op has no batched input). An input declared [*B, D] is read as lead + [D]:
    lead is every axis before the declared rest, zero or more, the same in every batched input."""
    where = where or (f"{NAMESPACE}.{op['name']}" if NAMESPACE else op["name"])
    folded, lead, first = dict(tensors), None, None
    for spec in op["inputs"]:
        if not is_batched(op, spec):
            continue
        name, t = spec["name"], tensors[spec["name"]]
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{where}: {name} must be a torch.Tensor, got {type(t).__name__}")
        rest = len(spec["dims"]) - 1
        torch._check(t.dim() >= rest,
                     lambda: f"{where}: {name} must have at least {rest} dims (*{op['batch']} then "
                             f"{_shape_text({'dims': spec['dims'][1:]})}), got shape {tuple(t.shape)} "
                             f"(signature: {op['signature']})")
        shape = tuple(t.shape[:t.dim() - rest])
        if first is None:
            lead, first = shape, (name, t)
        else:
            torch._check(shape == lead,
                         lambda: f"{where}: {name} has leading dims {list(shape)} (shape {tuple(t.shape)}) but "
                                 f"{first[0]} has {list(lead)} (shape {tuple(first[1].shape)}); the batch group "
                                 f"*{op['batch']} must be the same in every argument (signature: {op['signature']})")
        folded[name] = t.reshape((math.prod(shape),) + tuple(t.shape[t.dim() - rest:]))
    return folded, lead


def unfold_batch(op, outs, lead):
    """The outputs of `<op>_rows` with their batch axis back as the leading dims `lead`."""
    return tuple(o.reshape(tuple(lead) + tuple(o.shape[1:])) if is_batched(op, spec) else o
                 for spec, o in zip(op["outputs"], outs))


def batched_forward(op):
    """The public op of a batch group: fold the leading dims, run `<op>_rows`, restore them."""
    def forward(*args):
        inner = getattr(getattr(torch.ops, NAMESPACE), rows_name(op))
        tensors, scalars = split_args(op, args)
        folded, lead = fold_batch(op, tensors)
        result = inner(*join_args(op, folded, scalars))
        outs = unfold_batch(op, result if isinstance(result, tuple) else (result,), lead)
        return outs[0] if len(outs) == 1 else outs

    return forward


# ---------------------------------------------------------------- CUDA without _C

def _not_loaded(op, where):
    """The CUDA implementation of an op with a kernel when `_C` did not load: a clear error."""
    def unloaded(*args):
        raise RuntimeError(f"{where}: the CUDA kernels of {NAMESPACE} did not load ({CUDA_KERNELS_ERROR}); "
                           f"this wheel was built for torch {TORCH_VERSION} (torch {torch.__version__} is here): "
                           f"install the wheel built for this platform and torch, or run the op on the CPU")

    return unloaded


# ---------------------------------------------------------------- registration

def no_grad_inputs(op) -> list[str]:
    """The floating inputs the spec lists in `no_grad:` (the backward gives them no gradient)."""
    return [spec["name"] for spec in op["inputs"] if spec["floating"] and not spec["grad"]]


def refuse_no_grad_inputs(op, names: list[str], tensors: dict) -> None:
    """A call that asks for the gradient of one of `names` (no_grad_inputs) is refused: silently
    leaving its .grad empty would be a wrong result (the binding's C++ says the same). Called
    where a graph is recorded (grad mode on: inside an autograd.Function it reads off)."""
    for name in names:
        if tensors[name].requires_grad:
            raise RuntimeError(no_grad_message(op, name))


def no_grad_message(op, name: str) -> str:
    return (f"{NAMESPACE}.{op['name']}: {name} requires grad, but the op's spec lists it in no_grad (its backward "
            f"computes no gradient for {name}): pass {name}.detach(), or build the op from a spec without {name} "
            f"in no_grad")


def _autograd(op):
    qualname = f"{NAMESPACE}::{rows_name(op)}"
    backward_op = getattr(getattr(torch.ops, NAMESPACE), f"{op['name']}_backward") if op["has_backward"] else None
    no_grad = no_grad_inputs(op)

    def setup_context(ctx, inputs, output):
        tensors, scalars = split_args(op, inputs)
        refuse_no_grad_inputs(op, no_grad, tensors)
        outs = output if isinstance(output, tuple) else (output,)
        ctx.save_for_backward(*tensors.values(), *outs)
        ctx.scalars = scalars

    def backward(ctx, *grad_outputs):
        if backward_op is None:
            raise RuntimeError(f"{qualname} has no backward: its spec says `backward: none`")
        saved = ctx.saved_tensors
        inputs, outs = saved[:len(op["inputs"])], saved[len(op["inputs"]):]
        grads = [torch.zeros_like(o) if g is None else g
                 for g, o, spec in zip(grad_outputs, outs, op["outputs"]) if spec["floating"]]
        result = backward_op(*inputs, *ctx.scalars, *outs, *grads)
        result = iter(result if isinstance(result, tuple) else (result,))
        per_input = {spec["name"]: next(result) if spec["grad"] else None for spec in op["inputs"]}
        return tuple(per_input[name] if kind == "tensor" else None for kind, name in op["params"])

    torch.library.register_autograd(qualname, backward, setup_context=setup_context, lib=LIB)


def _autograd_saved(op):
    """The autograd of an op with saved intermediates, at the Autograd key as the binding's C++
    one: the forward runs `<op>_fwd_saved` below autograd once, and its saved values go to
    `<op>_backward` with the inputs and outputs (torch.library.register_autograd's
    setup_context sees only the public op's outputs)."""
    ns = getattr(torch.ops, NAMESPACE)
    fwd_saved, backward_op = getattr(ns, f"{op['name']}_fwd_saved"), getattr(ns, f"{op['name']}_backward")
    n_in, n_out = len(op["inputs"]), len(op["outputs"])

    class SavedFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *args):
            tensors, scalars = split_args(op, args)
            with torch._C._AutoDispatchBelowAutograd():
                found = fwd_saved(*args)
            outs = found[:n_out]
            ctx.save_for_backward(*tensors.values(), *found)
            ctx.scalars = scalars
            ctx.mark_non_differentiable(*[o for o, spec in zip(outs, op["outputs"]) if not spec["floating"]])
            return outs[0] if n_out == 1 else tuple(outs)

        @staticmethod
        def backward(ctx, *grad_outputs):
            saved = ctx.saved_tensors
            inputs, outs, values = saved[:n_in], saved[n_in:n_in + n_out], saved[n_in + n_out:]
            grads = [torch.zeros_like(o) if g is None else g
                     for g, o, spec in zip(grad_outputs, outs, op["outputs"]) if spec["floating"]]
            result = backward_op(*inputs, *ctx.scalars, *outs, *values, *grads)
            result = iter(result if isinstance(result, tuple) else (result,))
            per_input = {spec["name"]: next(result) if spec["grad"] else None for spec in op["inputs"]}
            return tuple(per_input[name] if kind == "tensor" else None for kind, name in op["params"])

    no_grad = no_grad_inputs(op)

    def autograd_forward(*args):
        if no_grad and torch.is_grad_enabled():
            refuse_no_grad_inputs(op, no_grad, split_args(op, args)[0])
        return SavedFunction.apply(*args)

    torch.library.impl(f"{NAMESPACE}::{rows_name(op)}", "Autograd", autograd_forward, lib=LIB)


def _register(op):
    """Schemas, the CPU path and fake kernels; CUDA for ops without a kernel (the reference)."""
    public = f"{NAMESPACE}::{op['name']}"  # `<op>_fwd_saved` and `<op>_backward` are named after it
    qualname = f"{NAMESPACE}::{rows_name(op)}"
    if op.get("batch"):  # the public op: a composite over `<op>_rows` (_register_batched)
        torch.library.define(public, op["schema"], lib=LIB)
    torch.library.define(qualname, op["schema"], lib=LIB)
    torch.library.impl(qualname, "CPU", _reference_forward(op), lib=LIB)
    torch.library.register_fake(qualname, _fake_forward(op), lib=LIB)
    if not op["has_kernel"]:
        torch.library.impl(qualname, "CUDA", _reference_forward(op), lib=LIB)
    if op.get("saved"):  # the outputs and the saved values, for the autograd of the op
        torch.library.define(f"{public}_fwd_saved", op["fwd_saved_schema"], lib=LIB)
        torch.library.impl(f"{public}_fwd_saved", "CPU", _reference_fwd_saved(op), lib=LIB)
        torch.library.register_fake(f"{public}_fwd_saved", _fake_fwd_saved(op), lib=LIB)
        if not op["has_kernel"]:
            torch.library.impl(f"{public}_fwd_saved", "CUDA", _reference_fwd_saved(op), lib=LIB)
    if op["has_backward"]:
        backward_name = f"{public}_backward"
        torch.library.define(backward_name, op["backward_schema"], lib=LIB)
        torch.library.impl(backward_name, "CPU", _reference_backward(op), lib=LIB)
        torch.library.register_fake(backward_name, _fake_backward(op), lib=LIB)
        if not op["has_backward_kernel"]:
            torch.library.impl(backward_name, "CUDA", _reference_backward(op), lib=LIB)


def _register_without_binding(op):
    """CUDA for an op with a kernel when `_C` did not load: the clear "did not load" error."""
    public = f"{NAMESPACE}::{op['name']}"
    torch.library.impl(f"{NAMESPACE}::{rows_name(op)}", "CUDA", _not_loaded(op, _where(op)), lib=LIB)
    if op.get("saved"):
        torch.library.impl(f"{public}_fwd_saved", "CUDA", _not_loaded(op, _where(op, "_fwd_saved")), lib=LIB)
    if op["has_backward_kernel"]:
        torch.library.impl(f"{public}_backward", "CUDA", _not_loaded(op, _where(op, "_backward")), lib=LIB)


def _register_batched(op):
    """The public op of a batch group (`x: Tensor[*B, D]`) as a CompositeImplicitAutograd kernel
    over `<op>_rows`: autograd, fake tensors and every device then go through the inner op's
    registrations, with no code of their own. The binding registers the same in C++ for ops
    with a kernel; this one serves the rest, and every op when `_C` did not load."""
    torch.library.impl(f"{NAMESPACE}::{op['name']}", "CompositeImplicitAutograd", batched_forward(op), lib=LIB)


# no op of the package has a CUDA kernel (or `_C` did not load): CUDA runs the references
CUDA_KERNELS_LOADED, CUDA_KERNELS_ERROR = False, None
if _DATA:  # a package's _ops: register its ops (specgen's own copy registers nothing)
    for _op in OPS.values():
        _register(_op)
    if _DATA.UNVERIFIED_OPS:
        # Built with `specgen build --no-verify`: say so before the compiled kernels load (their code
        # runs in this process from the next line on, and no GPU verification vouches for it).
        warnings.warn(f"{NAMESPACE}: the CUDA kernels of {', '.join(_DATA.UNVERIFIED_OPS)} were NOT verified on a "
                      f"GPU (this wheel was built with `specgen build --no-verify`) and are loaded now. Review them as "
                      f"code, and verify them with `specgen verify --locked` on a GPU before you rely on them.",
                      UnverifiedKernelWarning, stacklevel=3)
    if _DATA.HAS_KERNELS:
        try:  # the C++ CUDA (and Autograd) implementations, registered for the schemas defined above
            from . import _C  # noqa: F401
            CUDA_KERNELS_LOADED = True
        except ImportError as error:  # a torch without CUDA, or another torch: every op still runs on the CPU
            CUDA_KERNELS_ERROR = error
    for _op in OPS.values():
        if _op["has_kernel"] and not CUDA_KERNELS_LOADED:
            _register_without_binding(_op)
        if _op.get("batch") and not (CUDA_KERNELS_LOADED and _op["has_kernel"]):
            _register_batched(_op)  # else the binding's C++ composite
        # the binding registers, in C++, the autograd of ops whose backward is a kernel
        if not (CUDA_KERNELS_LOADED and _op["has_backward_kernel"]):
            _autograd_saved(_op) if _op.get("saved") and _op["has_backward"] else _autograd(_op)
