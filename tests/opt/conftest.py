"""Makes the shared graph builders in tests/opt/graphs.py importable as `graphs`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
