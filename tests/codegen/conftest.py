"""Makes the CPU backend test helpers in tests/codegen/cpu_helpers.py importable as `cpu_helpers`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
