"""`python -m jaxdl` is the `jaxdl` command."""

import sys

from jaxdl.cli import main

sys.exit(main())
