"""Files that survive a kill: atomic writes and JSON-lines logs.

`atomic_write(path, fn)` has `fn(tmp)` write a temporary sibling (a file or a folder), fsyncs it, and renames it over
`path`: a SIGKILL at any point leaves either the old `path` or the new one, never a torn mix (replacing an existing
folder takes two renames; a kill between them leaves the old one as `path + ".old"`). `atomic_write_json`
is the one-line form for small JSON files. `read_jsonl` / `append_jsonl` / `write_jsonl` read, extend and rewrite a metrics log, one JSON
object per line.
"""
import json
import os
import shutil
from collections.abc import Callable


def fsync_path(path: str) -> None:
    """fsync a file, or every file in a folder and the folder itself."""
    if os.path.isdir(path):
        for name in os.listdir(path):
            fsync_path(os.path.join(path, name))
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
    if os.path.isdir(tmp) and os.path.isdir(path):  # a folder cannot be renamed over a non-empty one
        old = path + ".old"
        _remove(old)
        os.replace(path, old)
        os.replace(tmp, path)
        _remove(old)
    else:
        os.replace(tmp, path)
    fsync_path(os.path.dirname(os.path.abspath(path)))


def atomic_write_json(path: str, obj, indent: int | None = 1) -> None:
    def write(tmp):
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=indent)
    atomic_write(path, write)


def read_jsonl(path: str) -> list[dict]:
    """Every JSON object of a JSON-lines file ([] when the file does not exist)."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def write_jsonl(path: str, records: list[dict]) -> None:
    """Replace a JSON-lines file atomically (a new file, then a rename)."""
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
