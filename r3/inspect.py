"""`python -m r3.inspect`: a command entry point, no code; the mismatch inspector is r3/tools/inspect.py."""
from r3.errors import run_main
from r3.tools.inspect import main

if __name__ == "__main__":
    run_main(main)
