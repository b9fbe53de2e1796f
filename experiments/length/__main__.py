"""`python -m experiments.length`: the long-response grid (experiments/length/grid.py)."""
from experiments.length.grid import main
from r3.errors import run_main

if __name__ == "__main__":
    run_main(main)
