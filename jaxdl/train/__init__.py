"""The training engine: state, pure steps, parallel strategies, checkpoints, resume and the loop."""

from jaxdl.train.assembly import Run, build
from jaxdl.train.checkpoint import load_run, load_state
from jaxdl.train.errors import (DiskFailure, NonFiniteLossError, PreflightError, RunError,
                                SpikeError)
from jaxdl.train.hooks import Hook, Hooks
from jaxdl.train.loop import run
from jaxdl.train.resume import WorkdirMismatchError
from jaxdl.train.step import (TrainState, create_train_state, evaluate, make_eval_step,
                              make_train_step, step_rngs)
from jaxdl.train.tasks import TASKS, Family, Task, TaskKind, kind_of, make_task, register_task
from jaxdl.train.workdir import WorkdirError, WorkdirLockedError

__all__ = ["run", "build", "Run", "load_run", "load_state", "Hook", "Hooks", "evaluate",
           "TrainState",
           "create_train_state", "make_train_step", "make_eval_step", "step_rngs", "TASKS", "Task",
           "TaskKind", "Family", "kind_of", "make_task", "register_task", "RunError", "DiskFailure",
           "NonFiniteLossError", "PreflightError", "SpikeError",
           "WorkdirMismatchError", "WorkdirError", "WorkdirLockedError"]
