"""Builds the Cython hot path (native/_codec.pyx).

Debug knobs (environment variables, read at build time):
  DNB_CYTHON_ANNOTATE=1   write the HTML annotation next to each .pyx
  DNB_CYTHON_LINETRACE=1  compile with line tracing for coverage/profilers
The extension is required: a build that cannot compile it fails loudly instead of
silently leaving the slow pure-Python twin in charge.
"""
import os

from Cython.Build import cythonize
from setuptools import Extension, setup

linetrace = os.environ.get("DNB_CYTHON_LINETRACE") == "1"
macros = [("CYTHON_TRACE_NOGIL", "1")] if linetrace else []

extensions = [
    Extension(
        "native._codec",
        sources=["native/_codec.pyx"],
        include_dirs=["native"],
        define_macros=macros,
        extra_compile_args=["-O3"],
    ),
    # Columnar decoding for the Spark reader: its own extension so it builds and ships
    # independently of the codec (native/columns.py picks the twin).
    Extension(
        "native._columns",
        sources=["native/_columns.pyx"],
        include_dirs=["native"],
        define_macros=macros,
        extra_compile_args=["-O3"],
    ),
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
