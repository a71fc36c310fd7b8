"""`python -m tf_resnet.jobs <subcommand> [args]`: see `cli`."""

import sys

from tf_resnet.jobs.cli import main

sys.exit(main())
