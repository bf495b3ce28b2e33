"""Runs: a plan being executed on nodes, its checkpoint schedule, durable checkpoints and retention."""
