"""The fast subset (``-m fast``, tests/conftest.py) names test modules that exist, and marks
exactly their tests."""

from pathlib import Path

import pytest
from conftest import FAST_MODULES

TESTS = Path(__file__).resolve().parent


def test_every_fast_module_exists():
    missing = sorted(name for name in FAST_MODULES if not (TESTS / f"{name}.py").is_file())
    assert missing == []


def test_this_module_is_marked_fast(request):
    assert request.node.get_closest_marker("fast") is not None


@pytest.mark.parametrize("module", ["test_extending", "test_faults", "test_training_options"])
def test_slow_modules_stay_out(module):
    assert (TESTS / f"{module}.py").is_file() and module not in FAST_MODULES
