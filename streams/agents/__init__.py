"""The Faust side of :mod:`..topology`: ``stage.register(app, ctx, stage)`` per stage."""
