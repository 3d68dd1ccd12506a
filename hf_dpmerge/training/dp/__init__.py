"""The differential-privacy mechanism of a training run: per-sample clipping and noise (:mod:`.privatizer`),
Poisson sampling (:mod:`.poisson_loader`), the accountant (:mod:`.accounting`), the state a checkpoint carries
(:mod:`.state`), what processes must agree on (:mod:`.cross_process`), and the private choice of one candidate
(exponential mechanism, permute-and-flip: :mod:`.private_selection`)."""
