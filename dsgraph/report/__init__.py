"""What dsgraph shows people: per-pass dumps, plots, compile reports, the command line, and
the capture of compiled graphs for predictions. It reads analyses; it never drives a
compile's decisions."""
