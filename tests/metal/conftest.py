"""Makes the Metal emulator (tests/metal/emulator.py) and the op × dtype cases (tests/codegen/dtype_matrix.py)
importable, and skips emulation tests where no C++ compiler is installed."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for path in (HERE, HERE.parent / "codegen"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
