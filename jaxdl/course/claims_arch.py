"""Claims of the course's architecture table, measured on jaxdl's own models.

  gnn_oversmoothing   repeated neighbour averaging makes a deep GCN's node embeddings point one
                      way: the spread (MAD, the mean cosine distance between node embeddings) of
                      the karate club's embeddings at initialization falls with depth, to ~0 by
                      16 layers (the gnn_depth experiment; no training needed).
"""

from __future__ import annotations

import numpy as np

from jaxdl.course.rows import Row, claim, close

# MAD at init of gnn_depth's GCN (seed 0) at depths 1, 2, 4, 8, 16, measured (gnn_depth docstring).
_DEPTHS = (1, 2, 4, 8, 16)
_MAD_AT_INIT = (0.537, 0.275, 0.065, 0.099, 0.0005)


@claim("gnn_oversmoothing", experiments=("gnn_depth",))
def gnn_oversmoothing(config) -> list[Row]:
  """Karate GCN at init: node-embedding spread (MAD) 0.54 at depth 1 -> 5e-4 at depth 16."""
  from jaxdl.config import variant_config
  from jaxdl.course.studies import embedding_spread
  spread = [embedding_spread(variant_config(config, {"model.num_layers": depth}))
            for depth in _DEPTHS]
  return [close("gnn_oversmoothing.mad_at_init_depths_1_2_4_8_16", list(_MAD_AT_INIT),
                np.round(spread, 4).tolist(), atol=1e-3),
          Row("gnn_oversmoothing.depth16/depth1", "< 0.01", round(spread[-1] / spread[0], 5),
              "stated", bool(spread[-1] < 0.01 * spread[0]))]
