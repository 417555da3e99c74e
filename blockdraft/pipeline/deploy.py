"""The end of the pipeline's summary: the `vllm serve` line that deploys what it exported, the same line
the export and the model card print (export/deploy_line.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, TextIO


def print_deploy(export_dir: Optional[Path], report: dict, stream: Optional[TextIO] = None) -> None:
    from blockdraft.export.deploy_line import export_deploy_line

    if export_dir is None or not (export_dir / "config.json").is_file():
        return
    line = export_deploy_line(export_dir)
    print("\n[pipeline] ================= deploy =================", file=stream)
    if not report.get("passed"):
        print("  the serve check did not pass (above): fix what it says before deploying; the line, once it does:",
              file=stream)
    print("\n".join(line.lines("  ")), file=stream)
