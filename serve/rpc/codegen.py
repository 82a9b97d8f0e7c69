"""Regenerate the gRPC stubs from ``inference.proto`` (``python -m serve.rpc.codegen [OUT_DIR]``).

The stubs are committed so that installing fastmode needs no code generation; a test runs this
into a temporary directory and checks the committed files match.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[2]
PROTO = "serve/rpc/inference.proto"


def generate(out_dir: Path = ROOT) -> None:
    """Write ``serve/rpc/inference_pb2.py``, ``.pyi`` and ``_pb2_grpc.py`` under ``out_dir``."""
    include = Path(protoc.__file__).parent / "_proto"
    code = protoc.main(["protoc", f"-I{ROOT}", f"-I{include}", f"--python_out={out_dir}", f"--pyi_out={out_dir}",
                        f"--grpc_python_out={out_dir}", str(ROOT / PROTO)])
    if code != 0:
        raise RuntimeError(f"protoc failed with exit code {code}")


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
