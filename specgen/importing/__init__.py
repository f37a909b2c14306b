"""`specgen import` and `specgen.spec_from`: a spec from a function or an nn.Module class.

    from specgen import spec_from
    imported = spec_from(rms_norm, [torch.randn(4096, 1024), torch.randn(1024)])
    print(imported.text())          # YAML with the guesses to confirm as comments

Modules: `target.py` (what to import, example inputs), `probe.py` (symbolic sizes by running
on other shapes), `infer.py` (signature, dtypes, ranges, reference), `render.py` (YAML).
"""
from __future__ import annotations

from .infer import ImportedSpec, infer_spec
from .probe import ImportRefused
from .target import INIT_INPUTS_FUNCTION, INPUTS_FUNCTION, Target, load_target, make_callee, target_from_object

__all__ = ["ImportRefused", "ImportedSpec", "import_target", "spec_from"]


def spec_from(fn_or_module, example_inputs=None, *, init_inputs=None, name: str | None = None,
              reference: str = "auto", dtypes: list[str] | None = None, backward: str | None = None,
              description: str | None = None) -> ImportedSpec:
    """A spec for a function or an nn.Module class, from example inputs (a list in argument
    order, or a dict by name). `reference`: "inline" copies the module's source into the
    spec, "import" references it by path (`module:name`), "auto" imports when the module is
    importable by name. A module class is built with `init_inputs` (default: its module's
    get_init_inputs()), and its parameters and buffers become inputs of the spec."""
    target = fn_or_module if isinstance(fn_or_module, Target) else target_from_object(fn_or_module)
    if example_inputs is None:
        helper = target.helper(INPUTS_FUNCTION)
        if helper is None:
            from ..errors import UsageError

            raise UsageError(f"{target.description}: give example inputs (its module has no {INPUTS_FUNCTION}())")
        example_inputs = helper()
    if init_inputs is None and target.is_module_class and target.helper(INIT_INPUTS_FUNCTION) is not None:
        init_inputs = target.helper(INIT_INPUTS_FUNCTION)()
    callee = make_callee(target, example_inputs, init_inputs)
    return infer_spec(callee, name=name, reference=reference, dtypes=dtypes, backward=backward,
                      description=description)


def import_target(text: str, *, inputs: str | None = None, init_inputs: str | None = None, **options) -> ImportedSpec:
    """`specgen import`'s work: TEXT is PATH.py:NAME, PATH.py (KernelBench) or pkg.module:NAME;
    `inputs` / `init_inputs` name the functions in the same module giving the examples."""
    from ..errors import UsageError

    target = load_target(text)
    inputs_name = inputs or INPUTS_FUNCTION
    helper = target.helper(inputs_name)
    if helper is None:
        raise UsageError(f"{text}: its module has no {inputs_name}() giving example inputs; define one "
                         f"(a list in argument order) or name another with --inputs FUNC")
    init = None
    if target.is_module_class:
        init_helper = target.helper(init_inputs or INIT_INPUTS_FUNCTION)
        if init_helper is None and init_inputs:
            raise UsageError(f"{text}: its module has no {init_inputs}()")
        init = init_helper() if init_helper else []
    return spec_from(target, helper(), init_inputs=init, **options)
