"""A deterministic simulation of a whole deployment under faults (design §14).

Two beats, two scanners, a reaper, three workers and two clients run their real code on a manual
clock, interleaved call by call by one seeded scheduler, while faults are injected; the world
checks the guarantees after every step and at the end. See docs/testing.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

# The simulation imports the tests' helpers (`faults`, `harness`) as top-level modules, as pytest
# does through tests/conftest.py; `python -m tests.simulation` needs the same path.
_TESTS = str(Path(__file__).resolve().parent.parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)
