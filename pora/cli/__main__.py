"""`python -m pora.cli`: the `pora` command."""

import sys

from pora.cli import main

sys.exit(main())
