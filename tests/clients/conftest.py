"""The running application of ``tests/serve`` (package-scoped: ``tests/clients`` gets its own)."""

from tests.serve.conftest import app  # noqa: F401
