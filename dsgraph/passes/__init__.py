"""dsgraph's graph passes, one file per pass; the file name is the pass name.

Each module defines ``SPEC`` (a ``dsgraph.registry.PassSpec``) and
``run(gm, ctx) -> dsgraph.context.PassResult``. ``dsgraph.registry`` lists them.
"""
