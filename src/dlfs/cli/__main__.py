"""`python -m dlfs.cli`: the `dlfs` command."""

import sys

from dlfs.cli.entry import main

sys.exit(main())
