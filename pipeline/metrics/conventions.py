"""The published conventions the metrics follow by default (the published code's choices, where a paper leaves them
open); `pipeline.scoring.options.EvaluateSettings` takes them as its defaults, and each metric documents its own."""

#: the published binarisation: a latent is active where its activation is > 1e-8
PUBLISHED_THRESHOLD = 1e-8

#: the published FMS averages FMS@p over p = 1..9 removals
PUBLISHED_REMOVALS: tuple[int, ...] = tuple(range(1, 10))
