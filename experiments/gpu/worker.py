"""GPU work in a separate, long-lived process, restarted after a fault.

The sweep process never touches CUDA: it renders, assembles and tracks. Loading, verifying and
timing kernels happen in one worker process (``multiprocessing`` spawn) that is kept across jobs,
so CuPy starts once per sweep. A kernel that faults (illegal address, sticky CUDA error), hangs
past the timeout or kills the process fails its own run; the worker is replaced and the sweep goes on.
"""
from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import socket
import tempfile
import time
import traceback

__all__ = ["GpuWorker", "WorkerError", "nvml_gpu", "measure_family", "device_info", "warm_up",
           "gpu_lock", "gpu_count", "claim_gpu"]


class WorkerError(RuntimeError):
    """The GPU work failed: the text says why (remote exception, timeout, or crash)."""


def nvml_gpu() -> dict | None:
    """The GPU that CUDA will use, as NVML sees it, without initialising CUDA: name, compute
    capability (int, e.g. 90), driver, CUDA driver version, PCI bus id. None when no NVIDIA
    GPU/driver is present or ``CUDA_VISIBLE_DEVICES`` hides every device ('' or -1); otherwise its
    first entry (an index or a GPU-UUID) selects the device."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    first = None if visible is None else visible.split(",")[0].strip()
    if first is not None and (first == "" or first.startswith("-")):
        return None
    try:
        import pynvml
        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() < 1:
            return None
        if first and first.startswith(("GPU-", "MIG-")):
            h = pynvml.nvmlDeviceGetHandleByUUID(first)
        else:
            h = pynvml.nvmlDeviceGetHandleByIndex(int(first) if first else 0)
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
        cuda = pynvml.nvmlSystemGetCudaDriverVersion_v2()
        name = pynvml.nvmlDeviceGetName(h)
        uuid = pynvml.nvmlDeviceGetUUID(h)
        return {"gpu": name.decode() if isinstance(name, bytes) else name,
                "uuid": uuid.decode() if isinstance(uuid, bytes) else uuid,
                "compute_capability": major * 10 + minor,
                "driver": str(pynvml.nvmlSystemGetDriverVersion()),
                "cuda_driver": f"{cuda // 1000}.{cuda % 1000 // 10}",
                "pci_bus_id": pynvml.nvmlDeviceGetPciInfo(h).busId}
    except Exception:  # noqa: BLE001 - no driver, no NVML, no device
        return None


# ----------------------------------------------------------------------------- in the worker
def device_info() -> dict:
    """Device and library versions as CuPy sees them (worker side)."""
    import cupy
    dev = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    rt = cupy.cuda.runtime.runtimeGetVersion()
    return {"gpu": props["name"].decode(), "compute_capability": int(dev.compute_capability),
            "cupy": cupy.__version__, "cuda_runtime": f"{rt // 1000}.{rt % 1000 // 10}",
            "sm_count": props["multiProcessorCount"], "pci_bus_id": dev.pci_bus_id}


def measure_family(family: str, precision: str, arch: str, params: list, build: dict, m: int, n: int,
                   k: int, timing: dict, rtol: float, seed: int, pci_bus_id: str | None = None,
                   smem_pad: int = 0, data: str = "full") -> dict:
    """Verify, then time, one kernel of a registered family (``experiments.families``; worker side).

    ``params`` are the resolved spec's (key, value) pairs and ``build`` the fields of its
    :class:`~experiments.families.base.Build` (kind, source, entry, options), as the job made them.
    The family's ``prepare`` makes the operands (C poisoned) and compiles the source (NVRTC for CUDA
    C++, the driver's JIT for PTX); one launch, a synchronize, then ``verify()``; only a verified
    kernel is timed with :func:`experiments.gpu.timing.time_launches` with the ``timing`` settings (regime,
    replicates; the SM clock, power and energy read on the GPU ``pci_bus_id`` during the timed batches,
    where NVML reads them, and the SMs' own clock over the timed window). ``rtol`` reaches families whose
    ``prepare`` takes it (float results); ``smem_pad`` (bytes of dynamic shared memory added to each
    block's launch: launch.blocks_per_sm, experiments.runner.kernel) reaches ``prepare`` when not 0; ``data``
    (the root key, when not ``full``) reaches ``prepare``, which draws the operands as it says
    (``Family.data_kinds``). Returns verified (bool), verify_* fields (verify_rtol: the tolerance
    used), jit_s (seconds of prepare), ``note`` (what is not like-for-like) and
    ``Prepared.info`` (fields the family reports itself: the default family's JIT seconds and
    resources), and when verified the timing dict and the GPU state before/after; where the kernel
    records its own cycles (``Prepared.clocks``), the timing dict holds them too.
    """
    import inspect

    import cupy

    from ..families import Build, get
    from .timing import gpu_state, time_launches

    fam = get(family)
    spec = fam.respec(precision, arch, params)
    b = Build(build["kind"], build["source"], build["entry"], tuple(build.get("options", ())))
    extra = {"rtol": rtol} if "rtol" in inspect.signature(fam.prepare).parameters else {}
    if smem_pad:
        extra["smem_pad"] = smem_pad
    if data != "full":
        extra["data"] = data
    t0 = time.perf_counter()
    prep = fam.prepare(spec, b, m, n, k, seed, **extra)
    jit_s = time.perf_counter() - t0
    prep.launch()
    cupy.cuda.Device().synchronize()
    res = prep.verify()
    out = {"verified": bool(res.ok), "verify_max_error": float(res.max_error),
           "verify_mismatches": int(res.mismatches), "verify_message": "" if res.ok else res.message(),
           "verify_rtol": float(res.tolerance), "jit_s": jit_s, "note": prep.note, **prep.info}
    if not res.ok:
        return out
    out["state_before"] = gpu_state(pci_bus_id)
    out["timing"] = time_launches(prep.launch, **timing, pci_bus_id=pci_bus_id)
    if prep.clocks is not None:         # the kernel's own cycles in its last timed launch
        out["timing"].update(prep.clocks())
    out["state_after"] = gpu_state(pci_bus_id)
    del prep
    cupy.get_default_memory_pool().free_all_blocks()
    return out


def warm_up(pci_bus_id: str | None = None) -> dict:
    """Pay this process's first-call costs on the GPU before its first kernel (worker side): the CUDA
    context, cuRAND and cuBLAS handles, CuPy's elementwise kernels of verification (int8 and fp16
    operands of 128 x 128 x 128, checked against their reference), a stream, events and NVML. Holds
    the GPU's lock shared (:func:`gpu_lock`): the job processes of a sweep warm up together, never
    while a kernel is timed on the GPU. Returns :func:`device_info`."""
    import cupy
    import numpy as np

    from .timing import gpu_state
    from .verify import check, make_operands
    with gpu_lock(pci_bus_id, shared=True):
        info = device_info()
        for precision, dtype in (("int8", np.int32), ("fp16", np.float32)):
            ops = make_operands(precision, 128, 128, 128, 0)
            c = (ops.a_ref @ ops.b_ref.T).astype(dtype)
            check(c, ops, dtype is np.float32, 1e-3)
        cupy.cuda.Event().record(cupy.cuda.Stream(non_blocking=True))
        cupy.cuda.Device().synchronize()
        gpu_state(pci_bus_id)
        cupy.get_default_memory_pool().free_all_blocks()
    return info


def _serve(conn) -> None:
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the sweep's to handle; it kills us
    # import what every call needs before the first one arrives (no CUDA context yet: it is made by
    # the first call, which the sweep makes while it holds the GPU)
    try:
        import cupy  # noqa: F401
        from . import launch, timing, verify  # noqa: F401
    except ImportError:
        pass                                        # the first call reports it
    funcs = {"measure_family": measure_family, "device_info": device_info,
             "warm_up": warm_up, "ready": lambda: True}
    while True:
        try:
            name, kwargs = conn.recv()
        except (EOFError, KeyboardInterrupt):
            return
        try:
            conn.send(("ok", funcs[name](**kwargs)))
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the sweep
            fatal = "CUDA" in type(exc).__name__ and type(exc).__module__.startswith("cupy")
            conn.send(("err", f"{type(exc).__name__}: {exc}", traceback.format_exc(), fatal))
            if fatal:   # a sticky CUDA error poisons the context: let the next call start afresh
                return


# ----------------------------------------------------------------------------- in the sweep
def gpu_count() -> int:
    """GPUs this process may use: the entries of CUDA_VISIBLE_DEVICES when set, else NVML's count
    (0 without a driver)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return 0 if nvml_gpu() is None else len([v for v in visible.split(",") if v.strip()])
    try:
        import pynvml
        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetCount()
    except Exception:  # noqa: BLE001 - no driver
        return 0


# job processes per GPU in a parallel sweep (hydra/launcher=gpus): while one verifies and times on the
# GPU (gpu_lock), the others render, assemble and track their next kernels. Three keep a GPU busy when
# a run holds it about as long as its build and tracking take (0.2-0.5 s each on an H200), and let a
# sweep of 3 x GPUs jobs (the study's presets have 6) start every job at once
JOBS_PER_GPU = 3


def _lock_path(kind: str, pci_bus_id: str) -> str:
    """The host-wide lock file of one GPU: ``kind`` 'slot' (claimed by a job process for its life)
    or 'gpu' (held while verifying and timing)."""
    name = "".join(c if c.isalnum() else "_" for c in pci_bus_id)
    return os.path.join(tempfile.gettempdir(), f"tensorcore-ablations-{kind}-{name}.lock")


_SLOT: list = []      # the descriptor of this process's GPU slot lock, open for the process's life


def _try_lock(path: str, shared: bool = False) -> int | None:
    """``fcntl.flock`` the file ``path`` without waiting: the open descriptor that holds the lock
    (closing it releases the lock), or None while another holder excludes it."""
    import fcntl
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def claim_gpu(on_wait=None) -> dict | None:
    """The GPU this process works on, as :func:`nvml_gpu` describes it (None without one).

    With CUDA_VISIBLE_DEVICES set to one GPU (by the user, or by Slurm for a task) that choice stands.
    On a node with several GPUs otherwise (all, or those CUDA_VISIBLE_DEVICES lists), the process
    claims one of the :data:`JOBS_PER_GPU` slots of a GPU
    (a lock per PCI bus id and slot, held until the process ends; first slot 0 of every GPU, then
    slot 1, so the first processes spread over the GPUs) and sets CUDA_VISIBLE_DEVICES to its UUID,
    so that parallel jobs (``hydra/launcher=gpus``) share each GPU by turns (:func:`gpu_lock`); when
    all slots are taken it waits (``on_wait()`` is called once).
    """
    if _SLOT or gpu_count() <= 1:
        return nvml_gpu()
    import pynvml
    pynvml.nvmlInit()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    entries = ([v.strip() for v in visible.split(",") if v.strip()] if visible is not None
               else [str(i) for i in range(pynvml.nvmlDeviceGetCount())])
    handles = [pynvml.nvmlDeviceGetHandleByUUID(e) if e.startswith(("GPU-", "MIG-"))
               else pynvml.nvmlDeviceGetHandleByIndex(int(e)) for e in entries]
    waited = False
    while True:
        for slot, h in ((s, h) for s in range(JOBS_PER_GPU) for h in handles):
            bus = pynvml.nvmlDeviceGetPciInfo(h).busId
            bus = bus.decode() if isinstance(bus, bytes) else bus
            if (fd := _try_lock(_lock_path("slot", f"{bus}-{slot}"))) is None:
                continue
            uuid = pynvml.nvmlDeviceGetUUID(h)
            _SLOT.append(fd)
            os.environ["CUDA_VISIBLE_DEVICES"] = uuid.decode() if isinstance(uuid, bytes) else uuid
            return nvml_gpu()
        if on_wait and not waited:
            on_wait()
            waited = True
        time.sleep(1.0)


# how often a process waiting for the GPU tries its lock (a blocking wait could not say after a while
# who holds it); a hand-over between two runs of 0.2-0.5 s then leaves the GPU idle for 2 ms at most
LOCK_POLL_S = 0.002
WAIT_NOTE_S = 5.0     # a wait for the GPU this long is worth a line (another sweep, or a long timing)


@contextlib.contextmanager
def gpu_lock(pci_bus_id: str | None, on_wait=None, shared: bool = False):
    """Hold the GPU for verification and timing: one holder per device at a time on this host.

    An inter-process lock per PCI bus id (``fcntl.flock`` on a file in the system's temporary folder),
    so that jobs of a parallel launcher (or two sweeps, or ncu) never time kernels on the same GPU at
    once; they wait their turn. ``shared``: GPU work that disturbs no other of its kind but must not
    run while a kernel is timed (:func:`warm_up`: the job processes of a sweep make their CUDA contexts
    together). ``on_wait(holder)`` is called once when the GPU has been busy for :data:`WAIT_NOTE_S`
    seconds (holder: 'pid N on HOST'); the jobs of one parallel sweep take turns in less.
    Raises OSError where the temporary folder cannot hold the lock file.
    """
    path = _lock_path("gpu", pci_bus_id or "default")
    noted, since = False, time.monotonic()
    while (fd := _try_lock(path, shared)) is None:
        if on_wait and not noted and time.monotonic() - since > WAIT_NOTE_S:
            try:
                holder = open(path + ".owner").read().strip()
            except OSError:
                holder = "another process"
            on_wait(holder)
            noted = True
        time.sleep(LOCK_POLL_S)
    try:
        if not shared:
            with open(path + ".owner", "w") as f:
                f.write(f"pid {os.getpid()} on {socket.gethostname()}")
        yield
    finally:
        os.close(fd)                # releases the lock


class GpuWorker:
    """Runs worker functions in a spawned process; restarts it after a crash, hang or CUDA fault."""

    def __init__(self):
        self._proc = None
        self._conn = None
        self.device: dict | None = None     # what warm_up answered (device_info) in the process now running

    def start(self) -> None:
        """Start the worker process now, without waiting for it (it imports CuPy while the caller
        builds its kernel); a call waits for it. Nothing happens when it is running."""
        self._ensure()

    def _ensure(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            return
        if mp.get_start_method(allow_none=True) not in (None, "spawn", "fork", "forkserver"):
            # inside a launcher's worker (joblib's loky): a spawned child must not inherit that method
            mp.set_start_method("spawn", force=True)
        ctx = mp.get_context("spawn")
        self.device = None
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child,), daemon=True, name="gpu-worker")
        self._proc.start()
        child.close()

    def stop(self) -> None:
        """Terminate the worker process (a new one starts at the next call)."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(5)
        self._proc = self._conn = None

    def call(self, name: str, timeout: float, **kwargs):
        """Call worker function ``name`` (measure_family, device_info, warm_up, ready); wait at
        most ``timeout`` seconds.

        Raises WorkerError with the remote exception text, or saying that the worker timed out
        (it is killed: a hung kernel cannot be interrupted otherwise) or died (exit code).
        """
        self.submit(name, **kwargs)
        return self.wait(name, timeout)

    def submit(self, name: str, **kwargs) -> None:
        """Send the call of ``name`` without waiting; :meth:`wait` gets its answer."""
        self._ensure()
        self._conn.send((name, kwargs))

    def wait(self, name: str, timeout: float):
        """The answer to the call of ``name`` submitted last, as :meth:`call` returns it and with
        its errors."""
        if not self._conn.poll(timeout):
            self.stop()
            raise WorkerError(f"no answer from the GPU worker within {timeout:g} s (the kernel may "
                              "hang); the worker was killed. Raise timing.timeout_s if it is just slow.")
        try:
            reply = self._conn.recv()
        except (EOFError, ConnectionError):
            code = self._proc.exitcode if self._proc else None
            self.stop()
            raise WorkerError(f"the GPU worker died (exit code {code}) while running {name}") from None
        if reply[0] == "ok":
            if name == "warm_up":
                self.device = reply[1]
            return reply[1]
        _, text, tb, fatal = reply
        if fatal:
            self.stop()
        raise WorkerError(f"{text}\n--- worker traceback ---\n{tb}")
