"""`python -m experiments.staleness`: the staleness grid, its pilot and controls (experiments/staleness/grid.py)."""
from experiments.staleness.grid import main
from r3.errors import run_main

if __name__ == "__main__":
    run_main(main)
