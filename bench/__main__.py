"""``python -m bench lanes ...``: the same as ``fastmode bench lanes ...`` (``bench.load``)."""

from bench.load import main

raise SystemExit(main())
