"""Only the optional C extension lives here; every other piece of metadata is in pyproject.toml.

``adapters._eventstream_c`` is the event-stream frame loop compiled (adapters/_eventstream.py falls back to
its pure-Python twin when it is missing). ``optional=True``: without a C compiler the build prints a
warning and the package installs anyway.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "adapters._eventstream_c",
            sources=["adapters/_eventstream_c.c"],
            extra_compile_args=["-O3"],
            optional=True,
        )
    ]
)
