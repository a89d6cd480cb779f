"""The compile driver: the backend entry point, one compile's session, the pass manager,
the pass registry and the pipeline language. It runs passes and the hooks they register;
it names no pass."""
