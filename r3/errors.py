"""The project's error types for bad input, and `run_main`, the one place that turns them into one line.

  InputError          something the user gave that r3 refuses: a flag, a path, a file's content, an engine's payload.
                      A ValueError; the message names what is wrong and where (file, field, row, position).
  MissingInputError   a path the user named that does not exist (an InputError and a FileNotFoundError).
  WriteError          a file r3 could not write (disk full, file too large, quota, permission): an OSError whose
                      message names the file, the error, the bytes it needed where known and what was kept
                      (`r3.runs.io.atomic_write`, `append_jsonl`).
  Stopped             the run ended on purpose before its end (a signal, `r3.runs.interrupt`): a SystemExit with
                      the exit status 128 + the signal's number and one line that says what is saved.
The other refusal types derive from InputError: `RoutesError` (r3/model/moe.py), `CheckpointError` (r3/scale/hf.py),
`CheckpointFileError` (r3/runs/checkpoint.py), `RunFolderError` (r3/runs/runfolder.py), `RemoteEngineError`
(r3/rollout/remote.py).

Every entry point runs its `main` through `run_main(main)` (train.py, rollout.py, python -m r3.check / r3.inspect /
r3.serve, the experiments). An InputError, an OSError about a named path (missing, not a folder, no permission, disk
full), a WriteError and a `sys.exit("message")` become `error: MESSAGE` on stderr, one line, exit status 1, no
traceback. A `Stopped` prints its line and exits with its status; a Ctrl-C that no handler took (before train.py
installs its own, `r3/runs/interrupt.py`) is one line too, exit status 130. Anything
else is a bug and keeps its traceback. `--debug` (anywhere on the command line; it is removed before the script's own
parser sees it) or `R3_DEBUG=1` shows the traceback of a refusal too.

Left out on purpose: catching ValueError or RuntimeError in general. torch and Python raise those for bugs, and a bug
must never be shown as if the user had made a mistake.
"""
import os
import sys
import traceback


class InputError(ValueError):
    """Input r3 refuses. The message names what is wrong and where."""


class MissingInputError(InputError, FileNotFoundError):
    """A path the user named that does not exist."""


class WriteError(OSError):
    """A write that failed: `WriteError(errno, message)`; the message names the file and what was kept."""


class Stopped(SystemExit):
    """A run that ended on purpose: `message` (one line, printed by run_main; "" on the ranks that do not print)
    and the exit status `code`."""

    def __init__(self, message: str, code: int):
        super().__init__(code)
        self.message = message


def user_message(e: BaseException) -> str | None:
    """The one-line message of a refusal, or None when `e` is a bug (or an ordinary exit) that must propagate."""
    if isinstance(e, SystemExit):
        if not isinstance(e.code, str):  # sys.exit(0 / 1), argparse's exit 2: already reported
            return None
        msg = e.code
    elif isinstance(e, InputError):
        msg = str(e)
    elif isinstance(e, WriteError):
        msg = e.strerror
    elif isinstance(e, OSError) and e.filename is not None:
        where = f"{e.filename} -> {e.filename2}" if e.filename2 is not None else str(e.filename)
        msg = f"{e.strerror or type(e).__name__} ({where})"
    else:
        return None
    msg = " ".join(line.strip() for line in msg.strip().splitlines()) or type(e).__name__
    return msg if msg.startswith("error: ") else f"error: {msg}"


def debug_requested(argv: list[str]) -> bool:
    return "--debug" in argv or os.environ.get("R3_DEBUG", "") not in ("", "0")


def run_main(main):
    """Call `main()` (which parses sys.argv); a refusal is printed as one `error: ...` line and exits with status 1.
    Returns what `main` returns."""
    debug = debug_requested(sys.argv[1:])
    sys.argv[1:] = [a for a in sys.argv[1:] if a != "--debug"]
    try:
        return main()
    except Stopped as e:
        if debug:
            traceback.print_exc()
        if e.message:
            print(e.message, file=sys.stderr, flush=True)
        sys.exit(e.code)
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        print("stopped by SIGINT (Ctrl-C)", file=sys.stderr, flush=True)
        sys.exit(130)
    except (Exception, SystemExit) as e:
        msg = user_message(e)
        if msg is None:
            raise
        if debug:
            traceback.print_exc()
        print(msg, file=sys.stderr, flush=True)
        sys.exit(1)
