"""`python -m r3.check`: a command entry point, no code; the route checker is r3/tools/check.py."""
import sys

from r3.errors import run_main
from r3.tools.check import main

if __name__ == "__main__":
    sys.exit(run_main(main))
