"""The training engine: state, pure steps, parallel strategies, checkpoints and the loop."""

from jaxdl.train.loop import (NonFiniteLossError, SpikeError, WorkdirMismatchError, build,
                              evaluate, run)
from jaxdl.train.state import TrainState, create_train_state
from jaxdl.train.step import make_eval_step, make_train_step, step_rngs
from jaxdl.train.tasks import TASKS, Task, make_task, register_task

__all__ = ["run", "build", "evaluate", "TrainState", "create_train_state", "make_train_step",
           "make_eval_step", "step_rngs", "TASKS", "Task", "make_task", "register_task",
           "NonFiniteLossError", "SpikeError", "WorkdirMismatchError"]
