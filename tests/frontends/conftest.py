"""Makes the ONNX test helpers (onnx_helpers.py, onnx_node_cases.py) importable by name."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
