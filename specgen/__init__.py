"""specgen: kernel specs in, verified CUDA kernels and installable wheels out."""

__version__ = "0.1.0"


def spec_from(fn_or_module, example_inputs=None, **options):
    """A spec (specgen.importing.ImportedSpec; `.text()` is its YAML) from a function or an
    nn.Module class and example inputs: see specgen.importing.spec_from."""
    from .importing import spec_from as _spec_from

    return _spec_from(fn_or_module, example_inputs, **options)
