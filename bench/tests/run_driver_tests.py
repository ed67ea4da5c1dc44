#!/usr/bin/env python3
"""ctest entry for mtbench's own tests: runs `python -m unittest` over bench/tests with the
virtualenv's python (the report tests need matplotlib), and says how to get it if it is missing."""

import os
import sys

venv_python = sys.argv[1] if len(sys.argv) > 1 else ".venv/bin/python"
if not os.access(venv_python, os.X_OK):
    print(f"bench-driver: {venv_python} not found: `make test` creates the virtualenv (or `make venv`)")
    sys.exit(1)
tests = os.path.dirname(os.path.abspath(__file__))
os.execv(venv_python, [venv_python, "-m", "unittest", "discover", "-v", "-s", tests, "-t", tests, "-p", "test_*.py"])
