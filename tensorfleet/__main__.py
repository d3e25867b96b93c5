"""``python -m tensorfleet``: the ``tensorfleet`` command, for an environment whose scripts are not on PATH."""

import sys

from tensorfleet.cli.main import main

sys.exit(main())
