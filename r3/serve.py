"""`python -m r3.serve`: a command entry point, no code; the SGLang-protocol stand-in server is r3/tools/serve.py."""
from r3.errors import run_main
from r3.tools.serve import main

if __name__ == "__main__":
    run_main(main)
