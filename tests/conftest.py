import sys
from pathlib import Path

import pytest

# Tests import their helpers (support.py) by plain name.
sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(scope="session")
def replayed_everything(tmp_path_factory):
    """One spark-replay over every protocol's captures (see replay_everything.py)."""
    pytest.importorskip("pyspark")
    from replay_everything import replay

    return replay(tmp_path_factory.mktemp("replay-everything"))
