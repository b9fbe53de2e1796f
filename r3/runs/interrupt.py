"""Signals that end a run at a step boundary, and the one line that says what is saved and how to go on.

    stops = Interrupts(lead=rank == 0, hard_stop=message)  # handlers for SIGINT, SIGTERM, SIGUSR1
    ...
    signum = stops.agreed(global_max)   # at each step boundary, on every rank: 0, or the signal to stop on

The first signal only records itself (and rank 0 prints a note): the step under way finishes, train.py saves its
checkpoint and raises `Stopped` with `stopped_line`, exit status 128 + the signal's number (130 SIGINT, 143 SIGTERM,
138 SIGUSR1; the shell's convention for a process a signal ended, so `$?` and a job scheduler see a run that did not
finish). A second signal stops at once: the handler raises `Stopped` with `hard_stop(signum)`, the line that names
the last good checkpoint; a checkpoint write it cuts removes its temporary file (`r3.runs.io.atomic_write`).

Which signals: SIGINT (Ctrl-C), SIGTERM (what `kill`, SLURM at the time limit, Kubernetes and torchrun send) and
SIGUSR1, the usual warning of a SLURM pre-emption or time limit (`sbatch --signal=USR1@120`), whose default action
would end the run at once without a word; a run told it is about to be stopped should save and stop, not go on to be
killed mid-step. Under torchrun, ranks get a signal at different moments: `agreed` takes the largest signal number
any rank received (an all-reduce MAX), so every rank stops at the same step boundary.

Left out: SIGHUP (a closed terminal; run under nohup, tmux or a scheduler), SIGKILL (cannot be caught; the last
periodic checkpoint is the one kept), and a stop inside a step (the step is finished first: at most one step's wait).
"""
import os
import shlex
import signal
import sys
import threading

from r3.errors import Stopped
from r3.runs.checkpoint import checkpoint_step

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


class Interrupts:
    """Handlers for SIGNALS, installed from construction until `restore()`. `received`: the first signal's number.
    Outside the main thread (where Python cannot set handlers) nothing is installed and the signals keep theirs."""

    def __init__(self, *, lead: bool, hard_stop):
        self.lead, self.hard_stop, self.received = lead, hard_stop, 0
        main = threading.current_thread() is threading.main_thread()
        self.previous = {s: signal.signal(s, self._handle) for s in SIGNALS} if main else {}

    def _handle(self, signum: int, frame) -> None:
        if self.received:
            raise Stopped(self.hard_stop(signum) if self.lead else "", 128 + signum)
        self.received = signum
        if self.lead:  # os.write, not print: the handler may run inside a print to stderr (tqdm's bar)
            again = "Ctrl-C" if signum == signal.SIGINT else name(signum)
            os.write(2, f"\nnote: got {name(signum)}: this step finishes, the checkpoint is saved, then the run "
                        f"stops; {again} again stops at once\n".encode())

    def agreed(self, reduce_max) -> int:
        """The signal to stop on at this step boundary, the same on every rank (0: go on). `reduce_max(x)`: the
        largest float x over ranks (the identity in one process)."""
        return int(reduce_max(float(self.received)))

    def restore(self) -> None:
        for s, h in self.previous.items():
            signal.signal(s, signal.SIG_DFL if h is None else h)  # None: a handler set outside Python


def name(signum: int) -> str:
    return signal.Signals(signum).name


def go_on(out: str, distributed: bool, saved: int | None = None) -> str:
    """What the run's folder holds to continue from, and the command that does: `--resume` in one process (the
    command line as given, with --resume and without --overwrite), a new run from OUT/hf under torchrun (`saved`:
    the steps done when it was written, where known)."""
    if distributed:
        hf = os.path.join(out, "hf")
        when = "of the last save" if saved is None else f"after step {saved - 1} ({saved} steps done)"
        return (f"{hf} holds the weights {when}; --resume is not supported under torchrun (no optimizer or RNG "
                f"state is saved): start a new run with --model {hf}")
    ckpt = os.path.join(out, "ckpt.pt")
    step = checkpoint_step(ckpt)
    if step is None:
        return f"no checkpoint was saved ({ckpt} does not exist): start the run over (--overwrite)"
    args = [a for a in sys.argv[1:] if a != "--overwrite"]
    command = shlex.join(["python", sys.argv[0], *args, *([] if "--resume" in args else ["--resume"])])
    return f"{ckpt} holds the state after step {step - 1} ({step} steps done); go on with: {command}"


def stopped_line(signum: int, out: str, distributed: bool, saved: int) -> str:
    """The line of a run stopped at a step boundary by its first signal, after the checkpoint was saved."""
    return f"stopped by {name(signum)} at a step boundary: {go_on(out, distributed, saved)}"


def hard_stop_line(signum: int, out: str, distributed: bool) -> str:
    """The line of a run stopped at once by a second signal: the step under way is lost."""
    return (f"stopped at once by a second {name(signum)}: the step under way is lost; the last good checkpoint: "
            f"{go_on(out, distributed)}")
