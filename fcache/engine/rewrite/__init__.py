"""Graph rewriting for the stitched graph: regions replaced by their callables
(stitch.py), chains of views folded (views.py), badly shaped matmuls padded (matmuls.py)."""
