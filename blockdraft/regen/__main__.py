"""`python -m blockdraft.regen target=... out=...`: the regeneration app."""

from blockdraft.regen.app import main

main()
