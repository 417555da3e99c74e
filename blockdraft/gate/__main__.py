"""`python -m blockdraft.gate`: the one-sample gate (app.py says what it checks)."""

import signal
import sys

from blockdraft.gate.app import main
from blockdraft.serve import cli

if __name__ == "__main__":
    signal.signal(signal.SIGTERM, cli.terminate_as_interrupt)
    sys.exit(main(sys.argv[1:]))
