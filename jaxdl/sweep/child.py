"""`python -m jaxdl.sweep.child ARGS`: `python -m jaxdl ARGS` in a run a local sweep started.

First, before anything that starts threads (jax, XLA's pools), the run takes its slot
(`slots.enter_slot`: its CPUs, SIGTERM when the sweep dies); then the `jaxdl` program runs as
`python -m jaxdl` runs it. The slot is entered here rather than by the program, so nothing of
the sweep package is imported by a `jaxdl` command a sweep did not start.
"""

import runpy

from jaxdl.sweep.slots import enter_slot

enter_slot()
runpy.run_module("jaxdl", run_name="__main__", alter_sys=True)
