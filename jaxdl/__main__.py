"""`python -m jaxdl` is the `jaxdl` command (`jaxdl.cli.main`).

Its stop handler is entered before even the command line package is imported: a signal met
there is taken over by `main`'s own (`jaxdl.stop_signals.Preemption` nests), which stops the
command in one line. (A run a local sweep started takes its slot in `main`, before jax loads.)
"""

import sys

from jaxdl import stop_signals

with stop_signals.Preemption() as early, early.polled():
  from jaxdl.cli import main
  code = main()
sys.exit(code)
