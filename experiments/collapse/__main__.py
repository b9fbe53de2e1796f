"""`python -m experiments.collapse`: the collapse protocol (experiments/collapse/protocol.py)."""
from experiments.collapse.protocol import main
from r3.errors import run_main

if __name__ == "__main__":
    run_main(main)
