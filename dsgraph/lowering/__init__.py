"""Triton lowering of fused regions (the ``lower_triton`` pass): planned, not built yet.

The pass name is registered in ``dsgraph.registry``; naming it raises "not implemented yet".
"""
