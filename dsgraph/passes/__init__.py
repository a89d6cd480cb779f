"""dsgraph's graph passes, one file per pass; the file name is the pass name.

Each module defines ``SPEC`` (a ``dsgraph.pass_api.PassSpec``) and
``run(gm, ctx) -> dsgraph.pass_api.PassResult``; ``dsgraph.compile.registry`` lists them.
Passes import ``dsgraph.pass_api`` and the layers below it, never the driver.
"""
