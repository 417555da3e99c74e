"""A full disk (or quota) met while writing: said as what it is, with what was kept and how to go on, instead of
a traceback. The writers that mark work done (checkpoints, exports, regen's rows) remove their partial file
first, so the space it took is free again and nothing half-written is ever taken for finished."""

from __future__ import annotations

import errno

from blockdraft.errors import DataError

FULL = (errno.ENOSPC, errno.EDQUOT)


class DiskFull(DataError):
    """No space left on the device (or over quota) while writing; nothing written before was touched."""


def is_disk_full(err: BaseException) -> bool:
    return isinstance(err, OSError) and err.errno in FULL


def disk_full(err: OSError, writing: str, kept: str, then: str) -> DiskFull:
    """`writing`: what was being written; `kept`: what is intact; `then`: how to go on once space is free."""
    return DiskFull(f"{err.strerror or 'no space left on the device'} while writing {writing}; {kept}. "
                    f"Free space there, then {then}.")
