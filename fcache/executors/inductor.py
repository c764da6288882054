"""The Inductor executor. By default a region is Inductor's Python wrapper with its built
kernels, on CPU and CUDA alike (fcache.executors.inductor_python: nothing to build at
load, no C++ runner to build at compile); with FCACHE_INDUCTOR_CPU=aoti or
FCACHE_INDUCTOR_CUDA=aoti, an AOTInductor package. The payload says which (a package is
a zip), so `load` needs no setting.

The routes per region, measured side by side on torch 2.13 on a 2-core CPU
(`python -m bench.inductor_packaging --device cpu`, bench/results/inductor_packaging-cpu.json):

    route                          compile   load (fresh process, empty Inductor cache)   call
    standalone_compile             ~1.6 s    ~3 s: g++ rebuilds every kernel (the
                                             artifact carries C++ source only)             ~29 us
    AOTInductor package            ~8 s      ~2-3 ms: dlopen, no compiler                  ~15 us
    Python wrapper + built kernels ~1.6 s    no compiler (0.43 s with Inductor's first
                                             import in a bare process)                     ~17 us

A package's compile is mostly its C++ runner (a g++ build of 6-7.5 s per region at -O1,
against 0.7 s for the kernel); it loads without importing Inductor and calls a little
faster. The Python route compiles at the speed of torch.compile's own kernels, and a
process that ran Dynamo has already imported what it loads with.

Loading safely. A package is a zip that torch's loader extracts before it dlopens the
library inside; it would write a member named `../x` outside its folder (zip-slip), and
for a package without a built library it would compile the C++ source with a command
read from the package. So `check_package` reads the member list first and refuses (as
CorruptArtifact) absolute names, `..` components, backslashes, links and special files,
a package without a shared library for the model, and more than MAX_UNPACKED_BYTES
unpacked. The loader then extracts into a private directory (0700, named after this
process) made for that one load: its temporary directory is pointed there for the call
(TMPDIR, which torch's C++ reads; set and restored under a lock). The directory is
removed when the load fails, and when the loaded region is garbage-collected (on CUDA the
loader reads kernels from it lazily, so not before); directories of processes that died
are swept by the next load. No `aotinductor_*` folder is left in the shared temp dir.

The key (`toolchain`): besides torch and, on CUDA, Triton and CUDA versions, the route
(python or aoti) and the options fcache compiles with, a digest of every Inductor option
in effect in this process (`torch._inductor.config`, as Inductor's own caches hash it:
`save_config_portable`), and
the TORCHINDUCTOR_* and TRITON_* variables set, except those that only name places or
tune caching, logging or parallelism (`ENV_IGNORED`): change any other, and the key
changes. Compile workers inherit the variables but not options set at run time in the
process that made the key, so set code-changing options through variables.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import shutil
import stat
import tempfile
import threading
import time
import weakref
import zipfile
from collections.abc import Iterator, Mapping, Sequence

import torch

from fcache import process
from fcache.cache.artifact import Artifact
from fcache.config import INDUCTOR_ROUTE_VARIABLES, INDUCTOR_ROUTES
from fcache.errors import CompileError, ConfigError, CorruptArtifact
from fcache.executors import inductor_python
from fcache.executors.base import CompiledRegion
from fcache.frontend.canonicalize import CanonicalRegion
from fcache.frontend.samples import inputs_for
from fcache.target import Target, options_digest, torch_version, triton_version

log = logging.getLogger(__name__)

# Options that change the generated code; they are part of the key (toolchain).
INDUCTOR_OPTIONS: Mapping[str, object] = {
    # Regions are small; -O1 on the wrapper is what Inductor uses by default too.
    "aot_inductor.compile_wrapper_opt_level": "O1",
}
# On CUDA, on top. Measured on the H100 (torch 2.11), one RoPE-backward region, first
# compile in a process with an empty Inductor cache: 76 s as Inductor sets it, 22 s
# without the CPU vector-ISA probe, 15 s without the precompiled header as well; later
# compiles in that process take 8-12 s (bench/results/gpu-h100-aoti-first-compile.json).
# - The probe compiles and loads a test library per x86 ISA (AVX-512, AVX2) against
#   torch's headers, to pick the flags of C++ kernels. A CUDA package has none: its C++
#   is the wrapper, which launches Triton kernels.
# - The precompiled header costs 6 s once per Inductor cache and saves about 1.3 s per
#   wrapper; a compile worker builds a handful of regions, so it does not pay off.
CUDA_OPTIONS: Mapping[str, object] = {
    "cpp.vec_isa_ok": False,
    "aot_inductor.precompile_headers": False,
}


# How regions are packaged, per device type: "python" (Inductor's Python wrapper and its
# built kernels, fcache.executors.inductor_python: no C++ runner to build, nothing to
# build at load) or "aoti" (an AOTInductor package). Read from the environment, so compile
# workers see it too (Settings.from_env checks it at start); part of the key.
ROUTES = INDUCTOR_ROUTES
ROUTE_ENVS = INDUCTOR_ROUTE_VARIABLES


def route(device_type: str) -> str:
    """The packaging route for regions of a device type (cpu or cuda)."""
    name = ROUTE_ENVS[device_type]
    value = os.environ.get(name, "python") or "python"
    if value not in ROUTES:
        raise ConfigError(name, value, " or ".join(ROUTES))
    return value


def options(device_type: str) -> dict[str, object]:
    """The Inductor options fcache compiles with for a device type."""
    return {**INDUCTOR_OPTIONS, **(CUDA_OPTIONS if device_type == "cuda" else {})}


ENV_PREFIXES = ("TORCHINDUCTOR_", "TRITON_")
# Variables of those prefixes that do not change generated code: places (caches, dumps,
# logs), cache switches, and how many threads or workers build it. Every other one set is
# part of the key (an unneeded miss is cheap; a hit across configurations is not).
ENV_IGNORED = re.compile(r"_DIR$|_PATH$|_HOME$|_FILE$|CACHE|COMPILE_THREADS$|WORKER")


def code_env(environ: Mapping[str, str]) -> str:
    """The TORCHINDUCTOR_*/TRITON_* variables that are part of the key, as NAME=value;..."""
    return ";".join(
        f"{name}={environ[name]}"
        for name in sorted(environ)
        if name.startswith(ENV_PREFIXES) and not ENV_IGNORED.search(name)
    )


# Entries Inductor itself writes during a compile (AOTInductor fills aot_inductor.metadata
# in place with the platform it built for), not settings: keyed otherwise (the target), and
# hashing them would give a process keys of its own after its first compile.
# `enable_autograd_for_aot` is set by torch while it loads a whole stored function
# (fcache.engine.whole.route): it says how that function's outputs are wrapped, not how a region
# compiles, and hashing it gave the regions a loading process looks up keys of their own.
CONFIG_IGNORED = ("aot_inductor.metadata", "enable_autograd_for_aot")


def config_digest() -> str:
    """xxh3-128 of the Inductor options in effect (what Inductor's caches hash too)."""
    from torch._inductor import config

    return options_digest(config, CONFIG_IGNORED)


# -- safe loading ------------------------------------------------------------------------

MAX_UNPACKED_BYTES = 4 << 30
_MODEL_DIR = "/data/aotinductor/model/"
_WORKDIR_PREFIX = "fcache-aoti-load-"  # then the pid (compiles use "fcache-aoti-")


def check_package(payload: bytes) -> list[str]:
    """The member names of an AOTInductor package, if it is safe to hand to torch's
    loader; CorruptArtifact naming the first problem otherwise (see the module doc)."""
    try:
        with zipfile.ZipFile(io.BytesIO(payload)) as archive:
            infos = archive.infolist()
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise CorruptArtifact(f"AOTInductor package is not a zip: {exc}") from None
    unpacked = 0
    names = []
    for info in infos:
        name = info.filename
        parts = name.split("/")
        if (
            not name
            or name.startswith("/")
            or "\\" in name
            or "\x00" in name
            or ":" in parts[0]
            or ".." in parts
            or "" in parts[:-1]
        ):
            raise CorruptArtifact(f"AOTInductor package member {name!r} escapes its folder")
        mode = info.external_attr >> 16
        if mode and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise CorruptArtifact(f"AOTInductor package member {name!r} is a link or device")
        unpacked += info.file_size
        names.append(name)
    if unpacked > MAX_UNPACKED_BYTES:
        raise CorruptArtifact(f"AOTInductor package unpacks to {unpacked} bytes")
    if not any(_MODEL_DIR in f"/{n}" and n.endswith(".so") for n in names):
        # Without a library the loader would build one, running a command the package names.
        raise CorruptArtifact("AOTInductor package has no built library for the model")
    return names


@contextlib.contextmanager
def _temp_dir_of_torch(path: str) -> Iterator[None]:
    """Point the C++ temporary directory (TMPDIR) at path for the block. The caller holds
    the executor's load lock: no two loads swap it at once."""
    before = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = path
    try:
        yield
    finally:
        if before is None:
            del os.environ["TMPDIR"]
        else:
            os.environ["TMPDIR"] = before


class InductorExecutor:
    name = "inductor"
    # 2: CUDA regions may be Inductor Python artifacts; 3: CPU ones too; 4: a CPU input of a
    # CUDA region is compiled as one (3 traced it on the GPU and refused such regions).
    version = "4"
    persistent = True
    compile_in_worker = True

    def __init__(self) -> None:
        # Held while a load points TMPDIR at its private directory.
        self._load_lock = threading.Lock()
        self._swept = False
        process.watch(self)

    def after_fork_in_child(self) -> None:
        self._load_lock = threading.Lock()

    def available(self, device_type: str) -> bool:
        return device_type in ("cpu", "cuda")

    def supports(self, region: CanonicalRegion, target: Target) -> bool:
        # Inductor lowers every core aten op, falling back to ATen calls inside the
        # package where it has no lowering: complex ops too (Llama4's rotary embedding,
        # `view_as_complex` and a complex multiply, compiled and validated on the CPU).
        return target.device_type in ("cpu", "cuda")

    def toolchain(self, target: Target) -> Mapping[str, str]:
        chain = {
            "torch": torch_version(),
            "options": repr(sorted(options(target.device_type).items())),
            "inductor_config": config_digest(),
            "env": code_env(os.environ),
        }
        chain["route"] = route(target.device_type)
        if target.device_type == "cuda":
            chain["triton"] = triton_version()
            chain["cuda"] = str(torch.version.cuda)
        return chain

    def compile(self, region: CanonicalRegion, device: torch.device) -> Artifact:
        start = time.perf_counter()
        module = region.materialize(device)
        example = tuple(region.example_inputs(device))
        if route(device.type) == "python":
            try:
                payload = inductor_python.compile_payload(
                    module, example, inputs_for(region, device), device
                )
            except inductor_python.Unsupported as exc:
                log.info("fcache: region packaged by AOTInductor: %s", exc)
            except Exception as exc:
                raise CompileError(f"Inductor failed: {type(exc).__name__}: {exc}") from exc
            else:
                return self._artifact(payload, start)
        try:
            program = torch.export.export(module, example, strict=False)
            with tempfile.TemporaryDirectory(prefix="fcache-aoti-") as tmp:
                path = os.path.join(tmp, "region.pt2")
                torch._inductor.aoti_compile_and_package(
                    program, package_path=path, inductor_configs=options(device.type)
                )
                with open(path, "rb") as f:
                    payload = f.read()
        except Exception as exc:
            raise CompileError(f"AOTInductor failed: {type(exc).__name__}: {exc}") from exc
        return self._artifact(payload, start)

    def _artifact(self, payload: bytes, start: float) -> Artifact:
        return Artifact(
            self.name,
            self.version,
            payload,
            compile_seconds=time.perf_counter() - start,
            producer={"torch": torch.__version__},
        )

    def load(self, artifact: Artifact, device: torch.device) -> CompiledRegion:
        index = device.index if device.index is not None else -1
        if device.type == "cuda" and index < 0:
            index = torch.cuda.current_device()
        if inductor_python.is_payload(artifact.payload):
            return inductor_python.load_payload(
                artifact.payload, device.type, index, self._load_lock
            )
        check_package(artifact.payload)
        base = tempfile.gettempdir()
        if not self._swept:
            self._swept = True
            process.sweep_dead_dirs(base, _WORKDIR_PREFIX)
        workdir = tempfile.mkdtemp(prefix=f"{_WORKDIR_PREFIX}{os.getpid()}-", dir=base)
        try:
            path = os.path.join(workdir, "region.pt2")
            with open(path, "wb") as f:
                f.write(artifact.payload)
            with self._load_lock, _temp_dir_of_torch(workdir):
                # Single-threaded run: the container's threaded run hands each call one of
                # its model instances and, once all are pending, waits on the GPU for the
                # previous call to finish (a cudaEventSynchronize): a region called by every
                # layer would make the host wait once per layer, and CUDA-graph capture
                # fails on that wait. Calls are serialized by the lock below instead.
                loader = torch._C._aoti.AOTIModelPackageLoader(path, "model", True, 1, index)
            os.unlink(path)  # unpacked by now; the library is mapped
        except RuntimeError as exc:
            shutil.rmtree(workdir, ignore_errors=True)
            raise CorruptArtifact(f"AOTInductor package does not load: {exc}") from exc
        except BaseException:
            shutil.rmtree(workdir, ignore_errors=True)
            raise
        # The unpacked files live as long as the loaded region (CUDA reads kernels lazily).
        weakref.finalize(loader, shutil.rmtree, workdir, True)
        return _serialized(loader.boxed_run)


def _serialized(run: CompiledRegion) -> CompiledRegion:
    """`run` (a single-threaded package's boxed run) safe to call from several threads
    (autograd's device threads, models stepped in threads): one call at a time."""
    lock = threading.Lock()

    def call(args: list[torch.Tensor]) -> Sequence[torch.Tensor]:
        with lock:
            return run(args)

    return call
