"""The whole-function route: a model's compiled forward stored whole (Dynamo's bytecode and
guards with fcache's programs inside), so that a warm process runs no Dynamo: the route
(route.py), its key computed without tracing (key.py), and a loaded function made live
in this process (live.py)."""
