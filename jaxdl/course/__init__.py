"""Course material measured through jaxdl: worked examples, toys, planted bugs and the claims.

Nothing in the library imports this package; it sits above `train`, `generative` and `doctor`
and uses only their public APIs. Importing `jaxdl.course` itself loads nothing heavy; import the
module you need:

  claims              every worked number of the course as a registered claim (the one place a
                      course number is written down; tests and `jaxdl reproduce` run them)
  rows                `Row`, `Claim`, the `@claim` registry and the `close` / `exact` comparisons
  reproduce           the `jaxdl reproduce` command (run the claims, print the table, JSON)
  measure             measurements behind the numbers (signal propagation, attention, dropout,
                      first loss, convolutions, GPT blocks, the two-point flow field)
  toys                optimizer toys on the public `make_optimizer`: a quadratic bowl, and
                      noisy/quiet weight groups under weight decay
  planted             the planted-bug model 'planted_mlp' and task 'planted_shuffled_labels'
                      (registered on import) for the doctor's experiments
  supervised_configs  shared configs of the supervised experiments (digits classifiers, the
                      karate club GNN, the stdlib GPT)
  studies             multi-run studies a study experiment's after_training hands its run to:
                      GNN depth, seq2seq bottleneck, associative recall, pre-/post-LN
  generative_configs  shared configs of the generative experiments (toy 2-D, digits)
  digits_judge        the digits_cnn judge of generated digits and the digits experiments' checks
  few_step_digits     reflow_ / distill_digits' procedures: students of the guided digits flow
  autoregressive_digits  ar_digits' procedure: exact bits/dim and judged samples of the GPT
  generative_table    generative_table's procedure: every family trained and measured
  sampler_table       `jaxdl nfe`: the judge found or trained, then the NFE sweep
  sweeps              `jaxdl sweep`: a grid of overrides over seeds, each point a resumable
                      `jaxdl train` subprocess; the report's means and t intervals
"""
