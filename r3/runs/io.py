"""Files that survive a kill: atomic writes and JSON-lines logs.

`atomic_write(path, fn)` has `fn(tmp)` write a temporary sibling (a file or a folder), fsyncs it, and renames it over
`path`: a SIGKILL at any point leaves either the old `path` or the new one, never a torn mix. An existing folder is
replaced by one atomic swap (`exchange`, Linux); where the OS cannot swap, by two renames, and a kill between them
leaves no `path` but the old folder as `path + ".old"` and the new one as `path + ".tmp"`. `atomic_write_json`
is the one-line form for small JSON files. `read_jsonl` / `append_jsonl` / `write_jsonl` read, extend (fsynced) and
atomically replace a metrics log, one JSON object per line; `r3/runs/runfolder.py` repairs a torn last line.
"""
import ctypes
import errno
import functools
import json
import os
import shutil
from collections.abc import Callable

from r3.errors import InputError


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


def atomic_write(path: str, write: Callable[[str], None]) -> None:
    """`write(tmp)` creates `path + ".tmp"` (a file or a folder); it is fsynced and renamed over `path`."""
    path = path.rstrip(os.sep)
    tmp = path + ".tmp"
    _remove(tmp)  # left by a killed writer
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
    fsync_dir(os.path.dirname(os.path.abspath(path)))
    _remove(old)  # this write's, or one a killed writer left between its two renames


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
    """A JSON object from `path`; `error` (an InputError) naming the file, and the line and column, when it is not one."""
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
    """Append one line, flushed and fsynced, so a kill loses at most the line being written."""
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)
