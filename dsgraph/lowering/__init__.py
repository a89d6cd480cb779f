"""Triton lowering of fused regions (the ``lower_triton`` pass): planned, not built yet.

The pass name is registered in ``dsgraph.compile.registry``; naming it raises "not
implemented yet". Lowering never imports passes (the pass imports lowering).
"""
