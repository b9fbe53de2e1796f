"""`python -m r3.plots`: a command entry point, no code; the run comparison plots is r3/runs/plots.py."""
from r3.errors import run_main
from r3.runs.plots import main

if __name__ == "__main__":
    run_main(main)
