"""One choice of the checkpoint a run resumes from, for every rank.

Each rank reading `checkpoints/` on its own can see another newest step on a shared file system that lags
(NFS attribute caches, object-store mounts): under ddp the ranks would load different weights, step and data
position after DDP's first broadcast, and say nothing; under fsdp they would hang in DCP's collectives. So
rank 0 chooses (as DCP's planner: rank 0 plans, all ranks agree), every rank compares what it sees of the run's
checkpoints and of the chosen one's files with rank 0's view, and the run stops on every rank, naming the
ranks and the files that differ, before any weight loads. The chosen checkpoint is then hashed once, its files
split over the ranks.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List, Optional

from blockdraft.errors import ConfigError
from blockdraft.ranks.distributed import DistInfo, all_gather_object, broadcast_object
from blockdraft.train import checkpoint as ckpt


def agree_on_resume_checkpoint(run_dir, resume: str, dist: DistInfo) -> Optional[Path]:
    """The checkpoint every rank resumes from (None: start afresh), verified; refused on every rank alike."""
    if resume == "never":
        return None
    choice, refusal = None, None
    if dist.is_main:
        try:
            choice = ckpt.choose_resume_checkpoint(run_dir, resume)
        except ConfigError as err:
            refusal = str(err)
    # Named within the run's checkpoints/ when it is one of them: each rank finds it in its own mount of run_dir.
    inside = choice is not None and choice.parent == ckpt.checkpoints_dir(run_dir)
    said, refusal = broadcast_object(((choice.name if inside else choice), refusal))
    if refusal is not None:
        raise ConfigError(refusal)
    choice = ckpt.checkpoints_dir(run_dir) / said if isinstance(said, str) else said
    views = all_gather_object(file_view(run_dir, choice))
    differing = [rank for rank, view in enumerate(views) if view != views[0]]
    if differing:
        raise ConfigError(describe_disagreement(run_dir, choice, views, differing))
    if choice is not None:
        ckpt.verify_checkpoint(choice, (dist.rank, dist.world_size))
    return choice


def file_view(run_dir, choice: Optional[Path]) -> Dict[str, object]:
    """What this process sees: the run's complete checkpoints, and every file of the chosen one with its size."""
    files: Dict[str, int] = {}
    if choice is not None and Path(choice).is_dir():
        for folder, _, names in os.walk(choice):
            for name in names:
                path = Path(folder) / name
                files[str(path.relative_to(choice))] = path.stat().st_size
    return {"checkpoints": [p.name for p in ckpt.complete_checkpoints(run_dir)], "files": dict(sorted(files.items()))}


def describe_disagreement(run_dir, choice: Optional[Path], views: List[dict], differing: List[int]) -> str:
    main = views[0]
    lines = []
    for rank in differing[:4]:
        view = views[rank]
        if view["checkpoints"] != main["checkpoints"]:
            lines.append(f"rank {rank} sees checkpoints {view['checkpoints']}, rank 0 sees {main['checkpoints']}")
        missing = sorted(set(main["files"]) - set(view["files"]))
        extra = sorted(set(view["files"]) - set(main["files"]))
        sized = sorted(n for n in set(main["files"]) & set(view["files"]) if main["files"][n] != view["files"][n])
        for what, names in (("lacks", missing), ("has more files:", extra), ("sees other sizes of", sized)):
            if names:
                lines.append(f"rank {rank} {what} {', '.join(names[:5])}{' ...' if len(names) > 5 else ''} in {choice}")
    more = f" (and {len(differing) - 4} more ranks)" if len(differing) > 4 else ""
    return (f"the ranks do not see the same checkpoints in {ckpt.checkpoints_dir(run_dir)}{more}, so they would resume "
            "from different states; nothing was loaded:\n  " + "\n  ".join(lines) +
            "\nThe run directory must be on a file system every node shares and sees alike: a lagging one (an NFS "
            "attribute cache, an object-store mount) shows a new checkpoint late. Wait a minute and resume again, "
            "mount it with close-to-open consistency (NFS: actimeo=0 or lookupcache=positive), or name the "
            "checkpoint: resume=<run_dir>/checkpoints/step_<N>.")
