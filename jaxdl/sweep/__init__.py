"""Sweeps: many runs of one experiment as one directory (`jaxdl sweep`, `jaxdl sweep report`).

A sweep directory holds

  sweep.json      the index (`index`): the experiment, the `--set` overrides every run shares,
                  the grid, the seeds, each run's overrides, status, exit code and error, the git
                  revision and library versions of the invocation that last ran it;
  runs/<name>/    one ordinary `jaxdl train` workdir per point and seed;
  logs/<name>.log each run's captured stdout and stderr, appended attempt after attempt;
  report/         the report's figures;
  study.log       a search's Optuna study (`jaxdl sweep --search`; its runs are `trial-NNN`).

A run's name is its overrides, keys sorted, values canonical (`optim.lr=0.001,seed=0`; `1e-3`
and `0.001` are one point), so the same grid always names the same directories and a grown grid
adds directories beside them (`grid`). The modules:

  grid     parse `--grid KEY=V1,V2`, expand points x seeds, name runs, validate every point's
           config in-process (`jaxdl.config.with_overrides` on the config the CLI loaded)
           before anything starts
  index    sweep.json: read, merge a new invocation in, write atomically; provenance
  scheduler the one loop: a grid's, a search's or SLURM's runs started (by default `jaxdl
           train` subprocesses, J at a time, each in a session of its own), stopped once on a
           stop signal, judged (finished, failed, stopped, vanished: started once more)
  runner   a grid on this machine: which runs a rerun skips, the queue the scheduler takes
  slots    each run's share of the CPUs and GPUs, applied by the run itself at startup (SIGTERM
           when the sweep dies)
  slurm    the same runs as a SLURM job array through submitit (`--executor slurm`); a rerun
           waits for queued jobs and resubmits cancelled ones, which resume
  resources what each run asks SLURM for: the --executor slurm flags and --executor-config
  report   per-point statistics of a metric over seeds (mean, t interval), the table, CSV /
           JSON and the figures; a search's table per trial
  space    a search's plan: parse `--space KEY=DIST`, `--search`, `--prune`, `--metric`, typed
           and checked against the config before anything starts; the Optuna objects
  search   run a search: the study as the scheduler's source of trials; report their metrics
           as they grow and prune; resume a stopped study on a rerun

A grid, a search and a SLURM job array differ in where runs come from (a `scheduler.Source`: a
queue, a study) and how they are started (a subprocess in a slot, a submitted array task); the
loop that keeps them going, stops them and judges how each ended is `scheduler.execute`. The
course's studies (`jaxdl.course.studies`) run their variants through it too, in their own
process. Nothing of this package is imported by `jaxdl train` or `--help`.
Importing this package loads nothing heavy (optuna only when a search runs, submitit only for
--executor slurm); import the module you need.

A run of `--jobs J` gets its slot's share of the CPUs, and XLA's CPU kernels may split work by
the thread count: with J > 1 a larger model's run can differ in the last bits from the same
command run alone (moons_mlp's runs under `--jobs 2` are the same, bit for bit: tested; J = 1
gives a run every CPU). Each run's record in sweep.json keeps its `slot` (CPUs, threads, GPU).

Measured (2026-12-01, 2-core CPU): `jaxdl sweep moons_mlp:smoke --grid optim.lr=1e-3,1e-2
--seeds 2 --jobs 2` took 64 s; the same command again, every run finished and skipped, 11 s.
"""
