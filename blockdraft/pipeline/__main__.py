"""`python -m blockdraft.pipeline ...`: see blockdraft/pipeline/app.py."""

import signal
import sys

from blockdraft.pipeline.app import main
from blockdraft.serve.cli import terminate_as_interrupt

if __name__ == "__main__":
    signal.signal(signal.SIGTERM, terminate_as_interrupt)
    sys.exit(main(sys.argv[1:]))
