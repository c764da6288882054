"""Executors turn a canonical region into an artifact, and an artifact into a callable.

Decisions worth knowing:

- The protocol (base.py) has five questions: available, supports, toolchain, compile,
  load. `compile` and `load` are pure functions of their arguments, because one process's
  artifact is loaded by others, on other machines.
- Executors are tried in order per region (registry.py): Inductor first (its regions
  load in milliseconds, nvFuser's are scheduled again in every process), then nvFuser
  where installed, and eager always last, so every region runs somehow.
- Inductor regions load without a compiler: Inductor's Python wrapper with its built
  kernels (cubins on CUDA, shared objects on CPU: inductor_python.py), which also compile
  without building a C++ runner per region; AOTInductor packages where set (inductor.py).
- nvFuser is a package behind a guard (nvfuser/): `import fcache` imports neither nvFuser
  nor CUDA.
- Adding an executor is one module and one `registry.register` call.
"""
