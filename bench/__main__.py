"""``python -m bench ...``: the same as ``fastmode bench ...`` (``bench.cli``)."""

from bench.cli import main

raise SystemExit(main())
