"""Build the native I/O interposition library (holoprof_io.c) with the package.

It is a plain shared library loaded with LD_PRELOAD into traced jobs, not a Python extension module;
setuptools' Extension machinery just compiles it into the package. ``optional=True``: without a C
compiler the install still succeeds and holoprof uses its pure-Python I/O layer.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "holoprof.collect.io_native.libholoprof_io",
            sources=["src/holoprof/collect/io_native/holoprof_io.c"],
            extra_compile_args=["-O2", "-fvisibility=hidden"],
            libraries=["dl"],
            extra_link_args=["-pthread"],
            optional=True,
        )
    ]
)
