"""Analyses: pure functions of FX graphs and Inductor's schedules (tensor lifetimes, buffer
plans, whole-step memory timelines, the cost model, the arena's packing). They decide
nothing and change no graph."""
