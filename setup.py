"""Builds the Cython hot path: the compiled twins in native/ (each ``_x.pyx`` mirrors ``_x_py.py``).

Debug knobs (environment variables, read at build time):
  DNB_CYTHON_ANNOTATE=1   write the HTML annotation next to each .pyx
  DNB_CYTHON_LINETRACE=1  compile with line tracing for coverage/profilers
The extensions are required: a build that cannot compile one fails loudly instead of
silently leaving the slow pure-Python twin in charge.
"""
import os

from Cython.Build import cythonize
from setuptools import Extension, setup

linetrace = os.environ.get("DNB_CYTHON_LINETRACE") == "1"
macros = [("CYTHON_TRACE_NOGIL", "1")] if linetrace else []


def _extension(name: str) -> Extension:
    return Extension(
        f"native.{name}",
        sources=[f"native/{name}.pyx"],
        include_dirs=["native"],
        define_macros=macros,
        extra_compile_args=["-O3"],
    )


extensions = [
    # The codec, one module per concept; native/__init__.py loads all three or none.
    # _append and _objects cimport the record/frame primitives of _frames (native/_frames.pxd).
    _extension("_frames"),
    _extension("_append"),
    _extension("_objects"),
    # Columnar decoding for the Spark reader: its own extension so it builds and ships
    # independently of the codec (native/columns.py picks the twin).
    _extension("_columns"),
]

setup(
    ext_modules=cythonize(
        extensions,
        language_level=3,
        annotate=os.environ.get("DNB_CYTHON_ANNOTATE") == "1",
        compiler_directives={
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "linetrace": linetrace,
        },
    ),
)
