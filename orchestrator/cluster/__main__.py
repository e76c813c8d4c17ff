"""``python -m orchestrator.cluster up | down | status | env``."""

import sys

from orchestrator.cluster.cli import main

sys.exit(main(sys.argv[1:]))
