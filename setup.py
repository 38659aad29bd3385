"""Only the optional C extensions live here; every other piece of metadata is in pyproject.toml.

``adapters._eventstream_c`` is the event-stream frame loop compiled (adapters/_eventstream.py falls back to
its pure-Python twin when it is missing); ``gateway.wire._views_c`` answers the commonest event's partial decode
from a cache (gateway/wire/events.py uses msgspec alone without it); ``gateway.observability._otlp_c`` encodes
OTLP spans and their attributes (gateway/observability/otlp_proto.py's pure-Python encoder without it).
``optional=True``: without a C compiler the build prints a warning and the package installs anyway.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "adapters._eventstream_c",
            sources=["adapters/_eventstream_c.c"],
            extra_compile_args=["-O3"],
            optional=True,
        ),
        Extension(
            "gateway.wire._views_c",
            sources=["gateway/wire/_views_c.c"],
            extra_compile_args=["-O3"],
            optional=True,
        ),
        Extension(
            "gateway.observability._otlp_c",
            sources=["gateway/observability/_otlp_c.c"],
            extra_compile_args=["-O3"],
            optional=True,
        ),
    ]
)
