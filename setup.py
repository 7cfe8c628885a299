"""Build the native I/O interposition library (the C sources in collect/io_native) with the package.

It is a plain shared library loaded with LD_PRELOAD into traced jobs, not a Python extension module;
setuptools' Extension machinery just compiles it into the package. Beside it, ``holoprof.collect._io_api``
is a small extension module through which the agent calls the preloaded library (without it, through
ctypes: some 2 ms and 700 objects more in each process). ``optional=True``: without a C compiler the
install still succeeds and holoprof uses its pure-Python I/O layer.
"""

from glob import glob

from setuptools import Extension, setup

NATIVE_DIR = "src/holoprof/collect/io_native"

setup(
    ext_modules=[
        Extension(
            "holoprof.collect.io_native.libholoprof_io",
            sources=sorted(glob(f"{NATIVE_DIR}/*.c")),
            depends=sorted(glob(f"{NATIVE_DIR}/*.h")),
            include_dirs=[NATIVE_DIR],
            extra_compile_args=["-O2", "-fvisibility=hidden"],
            libraries=["dl"],
            extra_link_args=["-pthread"],
            optional=True,
        ),
        Extension(
            "holoprof.collect._io_api",
            sources=["src/holoprof/collect/io_api/_io_api.c"],
            extra_compile_args=["-O2"],
            libraries=["dl"],
            optional=True,
        ),
    ]
)
