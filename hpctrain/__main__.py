"""``python -m hpctrain`` is the same as the ``hpctrain`` command."""

import sys

from hpctrain.cli import main

sys.exit(main())
