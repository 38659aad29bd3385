"""Benchmark harness: a fast fake Claude API, a checking load generator, and a runner that measures
direct-to-upstream and through-the-gateway side by side. See ``bench/README.md``."""
