"""What runs with the compiled graphs: the gradient pool, dsgraph's custom ops, wrappers."""
