"""specgen: kernel specs in, verified CUDA kernels and installable wheels out."""

__version__ = "0.1.0"
