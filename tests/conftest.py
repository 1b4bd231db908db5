import sys
from pathlib import Path

# Tests import their helpers (support.py) by plain name.
sys.path.insert(0, str(Path(__file__).resolve().parent))
