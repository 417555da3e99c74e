"""`python -m blockdraft.pipeline ...`: see blockdraft/pipeline/app.py."""

import signal
import sys

from blockdraft.pipeline.app import main
from blockdraft.pipeline.process import on_sigterm

if __name__ == "__main__":
    signal.signal(signal.SIGTERM, on_sigterm)
    sys.exit(main(sys.argv[1:]))
