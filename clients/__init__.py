"""Python SDK and the ``fastmode`` command line."""
