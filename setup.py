"""Only what pyproject.toml cannot say: map the top-level templates/ into the package."""
from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["specgen", "specgen.*"]) + ["specgen.templates"],
    package_dir={"specgen.templates": "templates"},
)
