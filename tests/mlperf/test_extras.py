"""Optional packages: each pin of mlperf/extras.py is the one setup.py's extras install."""
from mlperf.extras import PINS
from tests.helpers import ROOT


def test_every_pin_is_setups():
    setup = (ROOT / "setup.py").read_text()
    assert all(f'"{pin}"' in setup for pin in PINS.values()), PINS
