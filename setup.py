"""Build the optional C kernels; all other metadata lives in pyproject.toml.

The extension is optional: without a C compiler weightdiag installs anyway and uses its
pure-numpy kernels (identical results, several times slower).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "weightdiag.kernels._kernels",
            sources=["weightdiag/kernels/_kernels.c"],
            extra_compile_args=["-O3", "-std=c99"],
            optional=True,
        )
    ]
)
