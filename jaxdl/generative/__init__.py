"""Diffusion and flow matching as one Gaussian-path family: paths, losses, samplers, metrics.

`paths` (schedules, conversions), `closed_forms` (exact fields of known data), `losses` (denoising
regressions, condition dropout), `samplers` (`make_sampler`: one registry of updates, DDPM / DDIM /
Euler / Heun here, EDM-Heun and DPM-Solver++ in `solvers`, on the time grids of `spacings`, each
one `lax.scan`, classifier-free guidance; `SamplerSettings`, every setting and its default once),
`nfe_sweep` (quality against network calls: `jaxdl nfe`), `metrics` (energy distance, exact W2),
`tasks` (the
'flow_matching' and 'ddpm' training tasks), `evaluation` (post-training distances / classifier
check), `trained` (a trained run's samples and likelihood: `jaxdl sample`, `jaxdl likelihood`),
`likelihood` (exact log p(x) through the probability-flow ODE), `vae` and `gan` (the 'vae' and
'gan' models and tasks). The course's worked examples and the generative experiments' shared
configs live in `jaxdl.course`.
"""

from jaxdl.generative import losses, metrics, paths, samplers  # noqa: F401
from jaxdl.generative.samplers import make_sampler  # noqa: F401
# Registers the 'flow_matching' and 'ddpm' tasks in jaxdl.train.tasks.TASKS.
from jaxdl.generative import tasks as _tasks  # noqa: F401,E402
# Registers the 'vae' and 'gan' models and tasks.
from jaxdl.generative import gan, likelihood, vae  # noqa: F401,E402
