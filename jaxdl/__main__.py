"""`python -m jaxdl` is the `jaxdl` command."""

import sys

# First, before anything that starts threads: a run a local sweep started takes its slot (its
# CPUs, SIGTERM when the sweep dies; `jaxdl.course.sweeps.slots`). A no-op in any other process.
from jaxdl.course.sweeps.slots import enter_slot

enter_slot()

from jaxdl.cli import main  # noqa: E402

sys.exit(main())
