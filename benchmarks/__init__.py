"""Side-by-side measurements of eager, Inductor and dsgraph: ``python -m benchmarks.run --help``."""
