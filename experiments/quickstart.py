"""The README's main job, measured: `python train.py --r3` on the built-in toy default, and the numbers the README
quotes from it.

    python -m experiments.quickstart    # runs it (4-6 min on 2 cores), writes results/quickstart.{json,md}

The run goes to `--run-dir` (default runs/quickstart, replaced), exactly as the README's command makes it but for the
folder; training is one seeded thread, so the numbers are a function of the code (and the CPU's kernels), and
`python -m experiments.reproduce --check --only quickstart` tells when they stop coming out of it. Wall time and
peak memory are the machine's, and are not checked.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

from experiments.common import fmt, markdown_table, write_results
from r3.errors import InputError, run_main

COMMAND = ["train.py", "--r3"]
WINDOW = 20  # steps averaged at each end of the run for the reward


def summarize(rows: list[dict]) -> dict:
    """The README's figures from a run's metrics rows."""
    if len(rows) < 2 * WINDOW:
        raise InputError(f"{len(rows)} metrics rows: the summary needs at least {2 * WINDOW}")
    reward = [r["reward"] for r in rows]
    entropy = [r["entropy"] for r in rows if r.get("entropy") is not None]
    heldout = [dict(step=r["step"] + 1, accuracy=r["eval/accuracy"], accuracy_greedy=r["eval/accuracy_greedy"])
               for r in rows if r.get("eval/accuracy") is not None]
    return dict(steps=len(rows), reward_first=sum(reward[:WINDOW]) / WINDOW,
                reward_last=sum(reward[-WINDOW:]) / WINDOW, entropy_first=entropy[0], entropy_last=entropy[-1],
                heldout=heldout)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-dir", default="runs/quickstart", help="where the run goes (replaced)")
    p.add_argument("--out", default="results/quickstart.json", help="the summary (and .md beside it)")
    args = p.parse_args(argv)
    t0 = time.time()
    cmd = [sys.executable, *COMMAND, "--out", args.run_dir, "--overwrite", "--quiet"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"error: `{' '.join(cmd[1:])}` exited {r.returncode}: {r.stderr.strip()[-2000:]}")
    peak_gb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2 ** 20  # KiB on Linux
    with open(os.path.join(args.run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    summ = summarize(rows)
    lines = [f"`python {' '.join(COMMAND)}` ({summ['steps']} steps): training reward {fmt(summ['reward_first'])} -> "
             f"{fmt(summ['reward_last'])} (means of the first and last {WINDOW} steps), entropy "
             f"{fmt(summ['entropy_first'])} -> {fmt(summ['entropy_last'])} nats per token; peak memory "
             f"{peak_gb:.2f} GB and wall {time.time() - t0:.0f} s on this machine (not checked).", "",
             "Held-out exact-match accuracy (`eval/accuracy`, sampled; greedy beside it):", "",
             markdown_table(["after step", "sampled", "greedy"],
                            [[str(h["step"]), fmt(h["accuracy"]), fmt(h["accuracy_greedy"])] for h in summ["heldout"]])]
    md = "\n".join(lines)
    print(md)
    write_results(args.out, dict(command=" ".join(COMMAND), **summ, peak_rss_gb=peak_gb), t0=t0, md=md)


if __name__ == "__main__":
    run_main(main)
