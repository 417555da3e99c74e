"""Writes that survive a power loss once they return: what marks work done must be on the disk before it says so.

SQLite's and PostgreSQL's rule: write a temporary file, fsync it, rename it over the final name, then fsync the
directory (the rename is an entry of the directory, and until the directory is synced a crash may undo it while
keeping later writes). A reader sees the old file or the new one, never a torn one, and a returned write stays.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Union

PathLike = Union[str, os.PathLike]


def fsync_file(path: PathLike) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_dir(path: PathLike) -> None:
    """The directory's entries (a rename into it, a file created or removed) made durable. A file system that
    cannot sync a directory (some network ones) refuses with EINVAL or EBADF: nothing more can be done there."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_tree(root: PathLike) -> None:
    """Every file under `root`, then every directory bottom up (a checkpoint or an export before its rename)."""
    root = Path(root)
    if root.is_file():
        fsync_file(root)
        return
    directories = []
    for folder, _, files in os.walk(root):
        directories.append(folder)
        for name in files:
            fsync_file(os.path.join(folder, name))
    for folder in reversed(directories):
        fsync_dir(folder)


def replace_durably(tmp: PathLike, final: PathLike) -> None:
    """`tmp` (a file or a directory tree, complete) synced, renamed onto `final`, and the rename synced."""
    fsync_tree(tmp)
    os.replace(tmp, final)
    fsync_dir(Path(final).parent)


def write_bytes(path: PathLike, data: bytes) -> None:
    """`data` at `path`, whole and durable when this returns; a crash before leaves the previous file as it was."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk leaves no partial file behind
        raise
    fsync_dir(path.parent)


def write_text(path: PathLike, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_json(path: PathLike, value, indent: int = 2) -> None:
    write_text(path, json.dumps(value, indent=indent) + "\n")
