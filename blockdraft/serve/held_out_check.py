"""Are the prompts a draft is measured on held out from its training? Checked against the record of
prompts it trained on (training_prompts.bin, blockdraft/data/prompt_record.py) before any server
starts. A memorised prompt inflates acceptance, and users compare drafts by it: a prompt set holding
any of them is refused, saying how many and which key picks others, unless allow_training_prompts=true,
and then the report's headline says so. A draft with no record (another stack's export) is measured
with a one-line warning."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import List, Optional, Sequence

from blockdraft.data.prompt_record import RECORD_NAME, find_record, prompt_hash
from blockdraft.errors import ConfigError


@dataclass
class HeldOut:
    """One prompt set against one draft's training prompts."""

    owner: str
    """Whose training: "the draft <dir>", or "this run" before there is a draft."""
    prompts: int
    trained_on: int = 0
    """Of `prompts`, how many the draft trained on."""
    training_prompts: Optional[int] = None
    """How many prompts the draft's record holds; None without a record."""
    complete: bool = True
    allowed: bool = False
    """allow_training_prompts=true let a set holding trained-on prompts through."""

    @property
    def recorded(self) -> bool:
        return self.training_prompts is not None

    def headline(self) -> Optional[str]:
        """What a report says first when it measured prompts the draft trained on."""
        if not self.trained_on:
            return None
        return (f"MEASURED ON TRAINING PROMPTS: {self.trained_on} of the {self.prompts} prompts are among those the draft "
                "trained on (allow_training_prompts=true): its acceptance here is inflated by memorised prompts")

    def line(self) -> str:
        if not self.recorded:
            return (f"{self.owner} carries no record of the prompts it trained on ({RECORD_NAME}: exported by another "
                    "stack or an older blockdraft): measured as given, but nothing says these prompts are held out")
        if self.trained_on:
            return self.headline()
        gap = "" if self.complete else " (its record is incomplete: the draft started from one without a record)"
        return f"none of the {self.prompts} prompts is among the {self.training_prompts} training prompts of {self.owner}{gap}"

    def as_dict(self) -> dict:
        return {**asdict(self), "recorded": self.recorded, "line": self.line(), "headline": self.headline()}


def measure(draft_dir, identities: Sequence[int]) -> HeldOut:
    """How many of the prompts (their content hashes) the draft in `draft_dir` trained on."""
    record = find_record(Path(draft_dir))
    owner = f"the draft {draft_dir}"
    if record is None:
        return HeldOut(owner, len(identities))
    trained_on = int(record.contains(identities).sum())
    return HeldOut(owner, len(identities), trained_on, len(record), record.complete)


def refuse_trained_on(found: List[tuple], allow: bool, fix: str, allow_key: str = "allow_training_prompts") -> None:
    """`found`: (what was measured, HeldOut); every set holding trained-on prompts named in one line,
    unless `allow` (allow_training_prompts=true), which marks them allowed instead."""
    hits = [(what, held) for what, held in found if held.trained_on]
    if allow:
        for _, held in hits:
            held.allowed = True
        return
    if hits:
        said = "; ".join(f"{held.trained_on} of the {held.prompts} prompts of {what} are among the {held.training_prompts} "
                         f"training prompts of {held.owner}" for what, held in hits)
        raise ConfigError(f"{said} ({RECORD_NAME}): its acceptance there would be inflated by memorised prompts. Pick "
                          f"prompts it never trained on ({fix}), or set {allow_key}=true to measure them anyway (the "
                          "report then says so in its headline).")


def check_gate_prompt(export_dir, prompt: str, allow: bool) -> List[str]:
    """The gate trains its own draft on its one prompt and serves it there, by design: its record names that
    prompt alone, and nothing is checked. A draft the gate did not train (recheck=true on an export put in
    its place) is checked as any other: refused when it trained on the gate's prompt, unless
    allow_training_prompts=true. Returns the lines the verdict's warnings start with."""
    held = measure(export_dir, [prompt_hash([{"role": "user", "content": prompt}])])
    if held.training_prompts == 1 and held.trained_on == 1:
        return []
    refuse_trained_on([(f"the gate's prompt={prompt!r}", held)], allow, "prompt= another question")
    if not held.recorded:
        return [held.line()]
    return [held.headline()] if held.trained_on else []
