"""Triton lowering of fused regions (used by the ``lower_triton`` pass): region selection,
an aten-to-Triton code generator, kernels wrapped as ``torch.library.triton_op``, a check of
each kernel against the region's own ops, and the hand-off to Inductor as user-defined
Triton kernels. docs/LOWERING.md has the design. Lowering never imports passes (the pass
imports lowering).
"""
