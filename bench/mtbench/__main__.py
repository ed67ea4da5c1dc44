"""Entry point for `python -m mtbench` (run from bench/, or with bench/ on PYTHONPATH)."""
import sys

from .cli import main

sys.exit(main())
