"""Tests for jaxdl.models.denoiser and the generative tasks on the training engine."""

import json
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

import jaxdl.generative  # noqa: F401  (registers the denoisers and the tasks)
from jaxdl.generative import paths, samplers
from jaxdl.generative import tasks as gtasks
from jaxdl.models import build_model
from jaxdl.train.tasks import TASKS
from jaxdl.models.denoiser import MLPDenoiser, UNetDenoiser, timestep_embedding


def test_timestep_embedding_formula():
  t = jnp.array([0.0, 0.25])
  e = timestep_embedding(t, 8)
  f = np.exp(-np.log(10000.0) * np.arange(4) / 4)
  np.testing.assert_allclose(e[1], np.concatenate([np.cos(250 * f), np.sin(250 * f)]), atol=1e-4)
  np.testing.assert_allclose(e[0], [1, 1, 1, 1, 0, 0, 0, 0], atol=1e-6)


@pytest.fixture(scope="module")
def unet():
  model = UNetDenoiser(channels=(8, 16), emb_dim=16, num_classes=10)
  init = jax.jit(lambda k: model.init({"params": k}, jnp.zeros((1, 8, 8, 1)), train=False))
  return model, init(jax.random.PRNGKey(0))


def test_unet_keeps_the_input_shape_flat_or_image(unet):
  model, variables = unet
  x = jax.random.normal(jax.random.PRNGKey(1), (3, 8, 8, 1))
  t, y = jnp.array([0.1, 0.5, 0.9]), jnp.array([0, 4, 9])
  apply = jax.jit(lambda v, x: model.apply(v, x, t, y=y, train=False))
  image, flat = apply(variables, x), apply(variables, x.reshape(3, 64))
  assert image.shape == (3, 8, 8, 1) and flat.shape == (3, 64)
  assert bool(jnp.all(jnp.isfinite(image)))
  np.testing.assert_allclose(flat, image.reshape(3, 64), atol=1e-5)


@pytest.mark.parametrize("kind", ["mlp", "unet"])
def test_a_shared_time_embeds_once_and_equals_per_sample_times(unet, kind):
  """Samplers pass one time of shape (1,); it must give what B equal per-sample times give."""
  if kind == "unet":
    model, variables = unet
    x = jax.random.normal(jax.random.PRNGKey(1), (4, 8, 8, 1))
  else:
    model = MLPDenoiser(hidden=16, depth=2, emb_dim=16, num_classes=10)
    x = jax.random.normal(jax.random.PRNGKey(1), (4, 2))
    variables = model.init(jax.random.PRNGKey(0), x, train=False)
  y = jnp.array([0, 3, 10, 9])  # 10 is the null class
  per_sample = model.apply(variables, x, jnp.full((4,), 0.3), y=y, train=False)
  for shared in (jnp.array([0.3]), jnp.array(0.3)):
    np.testing.assert_allclose(model.apply(variables, x, shared, y=y, train=False), per_sample,
                               atol=1e-5)
  with pytest.raises(ValueError, match=r"t has shape \(3,\); expected"):
    model.apply(variables, x, jnp.zeros(3), y=y, train=False)


def test_unet_condition_and_time_change_the_output_and_none_is_the_null_class(unet):
  model, variables = unet
  x = jax.random.normal(jax.random.PRNGKey(1), (2, 8, 8, 1))
  t = jnp.array([0.3, 0.3])
  out = jax.jit(lambda t, y: model.apply(variables, x, t, y=y, train=False))
  np.testing.assert_allclose(out(t, None), out(t, jnp.array([10, 10])), atol=1e-6)
  assert not np.allclose(out(t, jnp.array([1, 1])), out(t, jnp.array([2, 2])))
  assert not np.allclose(out(t, None), out(t + 0.2, None))


@pytest.mark.parametrize("kind", ["mlp", "unet"])
def test_bf16_compute_dtype_with_fp32_params_and_output(kind):
  """`dtype` is the compute dtype the loop sets from `train.precision`: every layer's output is
  bf16, params stay fp32, the prediction is fp32 and close to the fp32 model's."""
  if kind == "mlp":
    cfg = dict(name="denoiser_mlp", hidden=32, depth=2, emb_dim=16, num_classes=3)
    x = jax.random.normal(jax.random.PRNGKey(1), (4, 2))
  else:
    cfg = dict(name="denoiser_unet", channels=(8, 16), emb_dim=16, num_classes=3)
    x = jax.random.normal(jax.random.PRNGKey(1), (4, 8, 8, 1))
  model = build_model(ml_collections.ConfigDict(dict(cfg, dtype="bfloat16")))
  assert model.dtype == jnp.bfloat16 and model.param_dtype == jnp.float32
  t, y = jnp.full((4,), 0.3), jnp.array([0, 1, 2, 3])
  variables = jax.jit(lambda k: model.init(k, x, t, y=y, train=False))(jax.random.PRNGKey(0))
  assert {a.dtype for a in jax.tree.leaves(variables)} == {jnp.dtype(jnp.float32)}
  out, state = model.apply(variables, x, t, y=y, train=False, capture_intermediates=True,
                           mutable=["intermediates"])
  inner = [a for path, a in jax.tree_util.tree_leaves_with_path(state["intermediates"])
           if "Dense" in jax.tree_util.keystr(path) or "Conv" in jax.tree_util.keystr(path)]
  assert inner and {a.dtype for a in inner} == {jnp.dtype(jnp.bfloat16)}
  assert out.dtype == jnp.float32 and out.shape == x.shape
  fp32 = model.clone(dtype=jnp.float32).apply(variables, x, t, y=y, train=False)
  np.testing.assert_allclose(out, fp32, atol=0.1)


def test_mlp_denoiser_through_the_registry_with_dropout():
  cfg = ml_collections.ConfigDict(dict(name="denoiser_mlp", hidden=32, depth=2, emb_dim=16,
                                       num_classes=3, dropout=0.5))
  model = build_model(cfg)
  assert isinstance(model, MLPDenoiser)
  x = jnp.ones((4, 2))
  variables = jax.jit(lambda k: model.init({"params": k}, x, train=False))(jax.random.PRNGKey(0))
  t = jnp.full((4,), 0.5)
  apply = jax.jit(lambda k: model.apply(variables, x, t, y=jnp.array([0, 1, 2, 3]), train=True,
                                        rngs={"dropout": k}))
  a, b = apply(jax.random.PRNGKey(1)), apply(jax.random.PRNGKey(2))
  assert a.shape == (4, 2) and not np.allclose(a, b)  # dropout is active in training


def _toy_config(task, **gen):
  c = ml_collections.ConfigDict()
  c.task = task
  c.model = dict(name="denoiser_mlp", hidden=32, depth=2, emb_dim=16, num_classes=0)
  c.gen = gtasks.default_gen_config(task)
  c.gen.T = 100
  c.gen.update(gen)
  return c


@pytest.mark.parametrize("task", ["flow_matching", "ddpm"])
def test_task_loss_trains_a_denoiser_on_two_points(task):
  """A few hundred Adam steps on data {-1, +1} (repeated in 2-D) lower the task loss."""
  import optax
  config = _toy_config(task)
  tk = TASKS[task](config, None)
  model = build_model(config.model)
  x = jnp.sign(jax.random.normal(jax.random.PRNGKey(0), (256, 1))) * jnp.ones((256, 2))
  params = jax.jit(lambda k: model.init({"params": k}, tk.init_input({"x": x}), train=False))(
      jax.random.PRNGKey(1))["params"]
  tx = optax.adam(3e-3)
  opt = tx.init(params)

  @jax.jit
  def step(params, opt, i):
    keys = jax.random.split(jax.random.fold_in(jax.random.PRNGKey(2), i), 4)
    rngs = dict(zip(("dropout", "noise", "time", "label_drop"), keys))
    (loss, _), g = jax.value_and_grad(tk.loss_fn, argnums=1, has_aux=True)(
        model.apply, params, {}, {"x": x}, rngs, True)
    upd, opt = tx.update(g, opt)
    return optax.apply_updates(params, upd), opt, loss

  eval_loss_jit = jax.jit(lambda p: tk.loss_fn(model.apply, p, {}, {"x": x}, {}, False)[0])
  eval_loss = lambda p: float(eval_loss_jit(p))
  before = eval_loss(params)
  for i in range(120):
    params, opt, _ = step(params, opt, i)
  assert eval_loss(params) < 0.8 * before


def test_task_honours_the_mask_and_checks_its_config():
  config = _toy_config("flow_matching")
  tk = TASKS["flow_matching"](config, None)
  model = build_model(config.model)
  x = jnp.ones((8, 2))
  init = jax.jit(lambda k: model.init({"params": k}, x, train=False))
  params = init(jax.random.PRNGKey(1))["params"]
  mask = jnp.array([1.0] * 4 + [0.0] * 4)
  a = tk.loss_fn(model.apply, params, {}, {"x": x, "mask": mask}, {}, False)[0]
  b = tk.loss_fn(model.apply, params, {}, {"x": x.at[4:].set(50.0), "mask": mask}, {}, False)[0]
  np.testing.assert_allclose(a, b, rtol=1e-6)
  with pytest.raises(ValueError, match="gen.prediction"):
    TASKS["flow_matching"](_toy_config("flow_matching", prediction="eps"), None)
  with pytest.raises(ValueError, match="num_classes"):
    TASKS["ddpm"](_toy_config("ddpm", num_classes=10), None)


def test_guided_sampling_with_a_real_unet(unet):
  model, variables = unet
  path = paths.make_path("ddpm", T=50, schedule="cosine")
  sample = samplers.make_sampler(model.apply, path, sampler="ddim", steps=5, sample_shape=(8, 8, 1),
                                 prediction="eps", guidance=2.0, num_classes=10, clip_x0=1.0)
  x = sample(variables, jax.random.PRNGKey(0), 4, y=3)
  assert x.shape == (4, 8, 8, 1) and bool(jnp.all(jnp.isfinite(x)))
  assert float(jnp.max(jnp.abs(x))) <= 1.0 + 1e-5  # the last DDIM step lands on a clipped x_hat
  with pytest.raises(ValueError, match="outside the trained range 0..9"):
    sample(variables, jax.random.PRNGKey(0), 4, y=10)


@pytest.mark.slow
def test_fm_toy2d_smoke_trains_on_the_engine_and_evaluates(tmp_path, capsys):
  """End to end: experiments/fm_toy2d.py:smoke through jaxdl.train.run, then the evaluation."""
  from jaxdl.config import load_config
  from jaxdl.generative import evaluation
  from jaxdl.train import load_run
  from jaxdl.train import run
  config, _ = load_config("experiments/fm_toy2d.py:smoke",
                          ["train.steps=30", "train.eval_every=30", "train.ckpt_every=30",
                           "train.plot=False", "data.n=2000", "data.n_eval=256",
                           "optim.ema_decay=0.9"])
  summary = run(config, tmp_path, progress=False)
  assert summary["step"] == 30 and np.isfinite(summary["eval"]["loss"])
  # sampling reads the parameter average from the checkpoint; ema=False gives the last iterate
  _, _, averaged, _ = load_run(tmp_path)
  _, _, last, _ = load_run(tmp_path, ema=False)
  gaps = jax.tree.leaves(jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))),
                                      averaged["params"], last["params"]))
  assert jax.tree.structure(averaged) == jax.tree.structure(last) and max(gaps) > 1e-4
  # `jaxdl sample` draws from the average by default, from the last parameters with --no-ema
  from jaxdl import cli
  base = ["sample", str(tmp_path), "--steps", "4", "--num", "8"]
  assert cli.main([*base, "--out", str(tmp_path / "ema.npy")]) == 0
  assert cli.main([*base, "--no-ema", "--out", str(tmp_path / "last.npy")]) == 0
  x_ema, x_last = np.load(tmp_path / "ema.npy"), np.load(tmp_path / "last.npy")
  assert x_ema.shape == x_last.shape == (8, 2) and np.abs(x_ema - x_last).max() > 1e-4
  assert cli.main([*base, "--class", "3"]) == 2  # an unconditional run: one clear error
  # `jaxdl likelihood`: the PF-ODE log-likelihood of the first 64 points of the eval split
  # (data_seed + 1 = 1), with the exact trace in 2-D and the parameter average
  from jaxdl.data import sample_toy2d
  from jaxdl.generative import likelihood
  capsys.readouterr()
  assert cli.main(["likelihood", str(tmp_path), "--num", "64", "--steps", "4"]) == 0
  printed = json.loads(capsys.readouterr().out)
  direct = likelihood.run_log_likelihood(config, load_run(tmp_path)[1], averaged,
                                         sample_toy2d("moons", 256, 1)[:64], steps=4)
  assert printed["num"] == 64 and printed["divergence"] == "exact"
  np.testing.assert_allclose(printed["nats"], float(np.mean(direct["logp"])), rtol=1e-5)
  np.testing.assert_allclose(printed["bits_per_dim"], float(np.mean(direct["bpd"])), rtol=1e-5)
  # solved 24 at a time (24, 24, 16): the same per-example values, so the same mean
  assert cli.main(["likelihood", str(tmp_path), "--num", "64", "--steps", "4",
                   "--batch-size", "24"]) == 0
  np.testing.assert_allclose(json.loads(capsys.readouterr().out)["nats"], printed["nats"],
                             rtol=1e-5)
  out = evaluation.evaluate(config, tmp_path, steps_list=(1, 4), num=200, repeats=2, figure=False)
  assert out["step"] == 30 and set(out["results"]) == {"euler@1", "euler@4", "heun@1", "heun@4"}
  assert out["floor"]["energy"] > 0 and len(out["floor"]["energy_rounds"]) == 2
  # each round draws a fresh target pair (a reused pair would give equal floors), and the
  # reported floor is their mean
  r0, r1 = out["floor"]["energy_rounds"]
  assert r0 != r1 and min(r0, r1) < out["floor"]["energy"] < max(r0, r1)
  assert out["results"]["euler@4"]["energy_se"] >= 0
  # one Euler step collapses towards the mean: far worse than 4 steps
  assert out["results"]["euler@1"]["energy"] > out["results"]["euler@4"]["energy"]
