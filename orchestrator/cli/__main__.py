"""``python -m orchestrator.cli``: the same as ``gpudays``."""

import sys

from orchestrator.cli.main import main

sys.exit(main())
