"""`perftracker demo`: the shipped training script, its separate fault injection, and the runner."""
