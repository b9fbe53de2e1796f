"""Not a test: a load generator, to check that no test depends on the machine's speed. It keeps N processes spinning
on the CPU until it is killed:

    python tests/load.py 2 & python -m pytest -q tests; kill %1

Its workers are its children: killing it (SIGTERM, SIGINT) ends them too, and a worker whose parent died ends itself.
"""
import multiprocessing
import os
import signal
import sys


def spin(parent: int) -> None:
    n = 0
    while True:
        n += 1
        if n % 1_000_000 == 0 and os.getppid() != parent:  # the parent was killed outright (SIGKILL)
            return


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else os.cpu_count()
    workers = [multiprocessing.Process(target=spin, args=(os.getpid(),), daemon=True) for _ in range(n)]
    for w in workers:
        w.start()
    print(f"load: {n} busy processes ({', '.join(str(w.pid) for w in workers)}) until killed", flush=True)

    def stop(*_):
        for w in workers:
            w.terminate()
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for w in workers:
        w.join()


if __name__ == "__main__":
    main()
