"""`python -m jaxdl` is the `jaxdl` command (`jaxdl.cli.main`: its first act is the stop handler;
a run a local sweep started takes its slot there, before the library is imported)."""

import sys

from jaxdl.cli import main

sys.exit(main())
