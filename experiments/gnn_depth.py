"""Over-smoothing measured: karate-club accuracy and node-embedding spread vs GCN depth.

Run:
  jaxdl train gnn_depth                 # depths 1, 2, 4, 8, 16, 32, 64; workdir runs/gnn_depth
  jaxdl train gnn_depth:gin             # the same sweep with the GIN layer
  jaxdl train gnn_depth:smoke           # depths 1 and 2, 20 steps each, for tests

Setup: karate_gnn (two labelled leaders, one-hot ids, width 16, AdamW 0.01, 200 steps, seed 0)
trained at each depth L. The experiment's own run is depth 2, in <workdir>; its after_training
(`jaxdl.course.studies.depth_sweep`) trains the other depths into <workdir>/depth_<L> (before
issue 24 depth 2 too was a subdirectory; same configs) and writes results.json, keyed depth_<L>.
Spread is MAD (Chen et al., 2020), the mean cosine distance between the last layer's node
embeddings (0: every member's embedding points the same way), at initialization and after
training.

Expected (measured, GCN, seed 0, one run per depth):

  depth L            1      2      4      8      16      32      64
  eval/accuracy    0.969  0.969  0.969  1.000  0.938   0.500   0.500
  MAD at init      0.537  0.275  0.065  0.099  0.0005  0.0001  0.0000
  MAD trained      0.285  0.411  0.239  0.305  0.138   0.028   0.039

Repeated averaging over neighbours makes the embeddings at initialization all point one way by
L = 16 (MAD 5e-4); training pulls them apart again up to L = 16, but at L = 32 and 64 the model
fits the two labelled leaders (train loss < 0.005) and labels the other 32 members at chance:
the course's over-smoothing with depth.
"""

from jaxdl.config import parse_arg, smoke
from jaxdl.course import studies
from jaxdl.course.supervised_configs import karate_gnn


def get_config(arg=None):
  args = parse_arg(arg, gin=False, smoke=False)
  c = karate_gnn("gnn_depth",
                 "Over-smoothing: karate accuracy and embedding spread (MAD) vs GNN depth",
                 conv="gin" if args.gin else "gcn")
  c.train.plot = False
  c.depths = (1, 2) if args.smoke else (1, 2, 4, 8, 16, 32, 64)
  return smoke(c) if args.smoke else c


def after_training(config, workdir, summary):
  """The other depths of `config.depths`, each run's accuracy and MAD (results.json)."""
  return studies.depth_sweep(config, workdir, summary)
