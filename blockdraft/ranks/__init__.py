"""The ranks of a run and what they share, below every stage that runs on several: the process group as
torchrun sets it up and its collectives (distributed.py), what every rank knows of the others through the
rendezvous store (rank_watch.py), and glibc's malloc on a CPU rank (cpu_allocator.py). The capture and
training both launch under torchrun, so neither owns this room."""
