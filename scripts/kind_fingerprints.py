"""Every draft kind trained a few steps on the tiny recipe with a fixed seed, then exported: prints (or writes)
the losses per step and the sha256 of every exported file. Run it before and after a change to the kinds'
code: equal output means the change left every kind's training and export byte-for-byte as it was.

    python scripts/kind_fingerprints.py --out before.json     # on the old code
    python scripts/kind_fingerprints.py --out after.json      # on the new code
    diff before.json after.json

Floating-point results differ between CPU classes: compare two runs of one machine only."""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WEIGHTS = (".safetensors", ".pt", ".bin")
KINDS = ("dflash", "dflash2", "jetspec", "domino", "dspark", "lilicorr")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _losses(run_dir: Path) -> list:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [[r["step"], r["loss"], r["grad_norm"]] for r in rows if "loss" in r]


def fingerprint(kind: str, work: Path, steps: int) -> dict:
    run, export = work / kind / "run", work / kind / "export"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    common = [f"run_dir={run}", "train.progress=false", f"train.max_steps={steps}", "train.log_every=1",
              f"train.save_every={steps}"]
    subprocess.run([sys.executable, "-m", "blockdraft.train", "experiment=tiny_cpu", f"draft={kind}", *common],
                   cwd=REPO, env=env, check=True, capture_output=True)
    subprocess.run([sys.executable, "-m", "blockdraft.export", f"checkpoint={run}", f"out={export}", "dtype=float32"],
                   cwd=REPO, env=env, check=True, capture_output=True)
    # The config and the weights by content; the other files by name (they record paths and times).
    files = {p.relative_to(export).as_posix(): _sha256(p) if p.name == "config.json" or p.suffix in WEIGHTS else "present"
             for p in sorted(export.rglob("*")) if p.is_file()}
    return {"losses": _losses(run), "export": files}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="write the JSON here (default: print it)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--kinds", nargs="*", default=list(KINDS))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        result = {kind: fingerprint(kind, Path(work), args.steps) for kind in args.kinds}
    text = json.dumps(result, indent=1, sort_keys=True)
    if args.out:
        Path(args.out).write_text(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
