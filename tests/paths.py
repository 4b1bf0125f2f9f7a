"""Where the tests are: ``TESTS`` (this folder, with the shared helpers) and ``ROOT`` (the repo)."""
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
