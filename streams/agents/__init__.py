"""One module per Faust agent; each exposes ``register(app, ctx)``."""
