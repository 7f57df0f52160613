"""Where a test finds the checkout and the data beside it, whatever folder under tests/ it sits in."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]        # the checkout: run.py, data/, configs/
SHARED = ROOT.parent / "shared"                   # fixtures and data sets beside the checkout
