"""ShareGPT's held-out range, defined once: regen's training prompts stay out of it unless asked, and
the serve check and the eval read their ShareGPT prompts from it by default.

Positions count the bundled file's usable prompts (conversations whose opening asks a question) from
0, in file order: the same count regen's prompt plan, `blockdraft serve prompts=sharegpt` and
`blockdraft eval datasets=[sharegpt]` use. ShareGPT repeats some openings (280 of the first 10,000
are asked again from position 10,000 on), so a range apart by position is not apart by content:
training also skips every prompt whose text the held-out range holds.
"""

from __future__ import annotations

from typing import Sequence, Set

from blockdraft.data.prompt_record import NO_PROMPT, prompt_hash

SHAREGPT_HELD_OUT_START = 10_000
"""The first held-out position: of the bundled file's 11,157 usable prompts, the last 1,157 are held out."""


def held_out_hashes(conversations: Sequence[Sequence[dict]], start: int = SHAREGPT_HELD_OUT_START) -> Set[int]:
    """The prompt hashes of `conversations[start:]`: what training must not take."""
    return {h for h in (prompt_hash(c) for c in conversations[start:]) if h != NO_PROMPT}
