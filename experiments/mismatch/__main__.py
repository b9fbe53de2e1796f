"""`python -m experiments.mismatch`: the mismatch table (experiments/mismatch/table.py)."""
from experiments.mismatch.table import main
from r3.errors import run_main

if __name__ == "__main__":
    run_main(main)
