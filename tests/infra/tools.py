"""The command-line checkers the infra tests run, found on ``PATH`` or beside this interpreter (the
``test`` extra installs check-jsonschema, kubernetes-validate and hadolint into the virtual
environment, whose ``bin`` ``make test`` does not put on ``PATH``)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def tool(name: str) -> str | None:
    """The path of the executable ``name``, or ``None`` where it is not installed."""
    return shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
