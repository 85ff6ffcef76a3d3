"""``python -m hpctrain.supervisor -- LAUNCHER ARGS...``: see hpctrain.supervisor."""

import sys

from hpctrain.supervisor.run import main

sys.exit(main())
