"""Stored programs: fcache's compiled aten graphs (graph.py) as AOTAutograd's cache keeps
them, with the plan of how each graph was cut (plan.py), their key (key.py) and their
place in fcache's tiers (store.py), so that a warm process skips AOTAutograd and
partitioning."""
