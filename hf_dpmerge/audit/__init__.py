"""Empirical privacy audit of a training configuration: canaries, membership guesses, the one-run ε lower bound
(Steinke, Nasr & Jagielski 2023). The top library layer: it trains with :mod:`hf_dpmerge.training`."""
