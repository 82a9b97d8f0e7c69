"""Probes: small measurements of one machine-level question (where the CPU goes while the
application starts, which threads wake up or wait), run by hand next to an application; each has
``--help`` and a smoke test in ``tests/bench``."""
