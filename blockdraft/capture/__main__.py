"""`python -m blockdraft.capture <training overrides> out=<dir>` (or under torchrun): the capture app."""

from blockdraft.capture.app import main

main()
