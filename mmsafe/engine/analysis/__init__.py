"""Analyses behind mmsafe's hooks, apart from the hooks' runner glue: the
loss-dict lint, the loss-weight probe and the MACL loss signals."""
