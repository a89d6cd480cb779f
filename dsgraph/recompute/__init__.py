"""Activation recomputation: joint-graph structure, segment options, peak model, solver."""
