"""Files that survive a kill: atomic writes and JSON-lines logs.

`atomic_write(path, fn)` has `fn(tmp)` write a temporary sibling (a file or a folder), fsyncs it, and renames it over
`path`: a SIGKILL at any point leaves either the old `path` or the new one, never a torn mix. An existing folder is
replaced by one atomic swap (`exchange`, Linux); where the OS cannot swap, by two renames, and a kill between them
leaves no `path` but the old folder as `path + ".old"` and the new one as `path + ".tmp"`. `atomic_write_json`
is the one-line form for small JSON files. `read_jsonl` / `append_jsonl` / `write_jsonl` read, extend (fsynced) and
atomically replace a metrics log, one JSON object per line; `r3/runs/runfolder.py` repairs a torn last line.

A write that fails (disk full, file-size limit, quota, a folder made read-only, an fsync's EIO) raises `WriteError`,
one line naming the file, the error, the bytes it needed where the caller knows them (`need=`), the space left, and
what was kept; nothing partial is left behind: `atomic_write` removes its temporary copy (on any exception, Ctrl-C
included) and `append_jsonl` cuts the file back to the lines it held. torch's and safetensors' own errors for a short
write (`RuntimeError: [enforce fail at inline_container.cc:...] unexpected pos`, `SafetensorError: ... (os error
28)`) are mapped here too, the only place that catches them; any other exception passes through untouched.
"""
import contextlib
import ctypes
import errno
import functools
import json
import os
import re
import resource
import shutil
from collections.abc import Callable

from r3.errors import InputError, WriteError


def fsync_path(path: str) -> None:
    """fsync a file, or every file in a folder and the folder itself: for what this process has just written."""
    if os.path.isdir(path):
        for name in os.listdir(path):
            fsync_path(os.path.join(path, name))
    fsync_dir(path)


def fsync_dir(path: str) -> None:
    """fsync `path` itself (for a folder: its entries, so a rename in it survives a crash), not what it holds. A
    parent folder is shared with other writers (a sweep's runs, a warm-up cache): walking it would open their
    temporary files, which they may rename away in between (seen as a flaky FileNotFoundError)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str, write: Callable[[str], None], need: int | None = None) -> None:
    """`write(tmp)` creates `path + ".tmp"` (a file or a folder); it is fsynced and renamed over `path`. A failure
    raises WriteError (`need`: the bytes the file takes, for its message) and leaves no `path + ".tmp"`."""
    path = path.rstrip(os.sep)
    tmp = path + ".tmp"
    _remove(tmp)  # left by a killed writer
    existed, replaced = os.path.lexists(path), False
    try:
        write(tmp)
        fsync_path(tmp)
        old = path + ".old"
        if os.path.isdir(tmp) and os.path.isdir(path):  # a folder cannot be renamed over a non-empty one
            if exchange(tmp, path):  # one atomic swap; tmp now holds the old folder
                old = tmp
            else:
                _remove(old)
                os.replace(path, old)
                os.replace(tmp, path)
        else:
            os.replace(tmp, path)
        replaced = True
        fsync_dir(os.path.dirname(os.path.abspath(path)))
    except BaseException as e:
        written = _size(tmp)
        if os.path.lexists(path) or not os.path.lexists(path + ".old"):  # not in the gap of two renames
            with contextlib.suppress(OSError):
                _remove(tmp)
        kept = (f"{path} is written but its folder could not be synced" if replaced else
                f"{'the previous ' + path + ' is intact' if existed else path + ' was not written'}; the partial "
                f"{tmp} is removed")
        err = write_error(e, path, written, need, kept)
        if err is e:
            raise
        raise err from e
    _remove(old)  # this write's, or one a killed writer left between its two renames


def write_error(e: BaseException, path: str, written: int | None, need: int | None, kept: str) -> BaseException:
    """`e` as a WriteError naming `path`, what it needed and what was `kept`, when it is a failed write (an OSError,
    or torch's or safetensors' error for one); `e` itself otherwise (a bug, Ctrl-C)."""
    text = str(e)
    code = getattr(e, "errno", None) if isinstance(e, OSError) else None
    found = re.search(r"\(os error (\d+)\)|Os \{ code: (\d+)", text)  # how safetensors (Rust) names it
    if type(e).__name__ == "SafetensorError" and found:
        code = int(found.group(1) or found.group(2))
    torch_short = isinstance(e, RuntimeError) and ("inline_container" in text or "PytorchStreamWriter" in text)
    if code is None and not torch_short:
        return e
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    limited = limit != resource.RLIM_INFINITY and (code == errno.EFBIG or (code is None and (written or 0) >= limit))
    if limited:  # torch's writer checks how far it got, not why: the likely cause
        code = errno.EFBIG
    cause = (f"torch's writer stopped ({text.strip().splitlines()[0][:120]})" if code is None else
             f"{os.strerror(code)} [{errno.errorcode.get(code, code)}]" +
             (f" (the file-size limit, ulimit -f, is {limit:,} bytes)" if limited else ""))
    sizes = ", ".join(x for x in (f"it needs about {need:,} bytes" if need else "",
                                  f"{written:,} bytes were written" if written else "", _free(path)) if x)
    return WriteError(code or errno.EIO, f"error: cannot write {path}: {cause}; {sizes + '; ' if sizes else ''}{kept}")


def _size(path: str) -> int | None:
    """Bytes of a file, or of the files of a folder; None when it does not exist."""
    if os.path.isdir(path):
        return sum(_size(os.path.join(path, n)) or 0 for n in os.listdir(path))
    return os.path.getsize(path) if os.path.isfile(path) else None


def _free(path: str) -> str:
    try:
        st = os.statvfs(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return ""
    return f"{st.f_bavail * st.f_frsize:,} bytes are free there"


def exchange(a: str, b: str) -> bool:
    """Swap two existing paths in one atomic step (Linux `renameat2(RENAME_EXCHANGE)`, ext4/xfs/btrfs/tmpfs).
    Returns False, having changed nothing, where the C library or the filesystem cannot."""
    fn = getattr(_libc(), "renameat2", None)
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), a, b)


_AT_FDCWD, _RENAME_EXCHANGE = -100, 2


@functools.lru_cache(maxsize=1)
def _libc():
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def atomic_write_json(path: str, obj, indent: int | None = 1) -> None:
    def write(tmp):
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=indent)
    atomic_write(path, write)


def read_json_object(path: str, error: type = InputError) -> dict:
    """A JSON object from `path`; `error` (an InputError) naming the file, and the line and column, when it is not
    one."""
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from e
    except json.JSONDecodeError as e:
        raise error(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from e
    if not isinstance(obj, dict):
        raise error(f"{path}: expected a JSON object, got {type(obj).__name__}")
    return obj


def read_jsonl(path: str) -> list[dict]:
    """Every JSON object of a JSON-lines file ([] when the file does not exist)."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def write_jsonl(path: str, records: list[dict]) -> None:
    """Replace a JSON-lines file atomically (a new file, fsynced, renamed over it)."""
    def write(tmp):
        with open(tmp, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    atomic_write(path, write)


def append_jsonl(path: str, record: dict) -> None:
    """Append one line, flushed and fsynced, so a kill loses at most the line being written. A failed write cuts
    the file back to the lines it held and raises WriteError."""
    line = json.dumps(record) + "\n"
    size = os.path.getsize(path) if os.path.exists(path) else 0
    try:
        with open(path, "a") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        try:  # the failed line, partly written, must not stay
            os.truncate(path, size)
            kept = f"{path} is cut back to the {size:,} bytes it held (the new line is not in it)"
        except OSError:
            kept = f"{path} may end in a torn line, which a resume repairs"
        raise write_error(e, path, None, len(line.encode()), kept) from e


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)
