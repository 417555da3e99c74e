"""One rank of tests/integration/test_resume_agreement.py under torchrun: agrees on the checkpoint to resume from
in each case's view of the run directory (argv[1], a JSON {case: [run dir of rank 0, 1, 2]}) and writes what it
got, or what it raised, to argv[2]/<case>.rank<r>.json."""

import json
import sys
from pathlib import Path

from blockdraft.ranks import distributed
from blockdraft.train.resume_choice import agree_on_resume_checkpoint


def main(cases_file: str, out: str) -> None:
    cases = json.loads(Path(cases_file).read_text())
    dist = distributed.init_distributed(startup_timeout_s=30, timeout_s=10)
    for name, run_dirs in cases.items():
        try:
            got = agree_on_resume_checkpoint(run_dirs[dist.rank], "auto", dist)
            result = {"kind": "ok", "text": got and got.name}
        except Exception as err:  # what each rank raised, compared by the test
            result = {"kind": type(err).__name__, "text": str(err)}
        (Path(out) / f"{name}.rank{dist.rank}.json").write_text(json.dumps(result))
    distributed.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:3])
