"""``python run.py ARGS`` without paying the interpreter's start-up and imports each time.

Run as a script, this is a long-lived process that imports what run.py imports (Hydra, OmegaConf,
MLflow with its SQL store, ``experiments``, the plotting modules a sweep loads), opens no store and touches no GPU, then serves requests
read from stdin: for each it forks a child that takes the request's folder, environment and argv,
sends its fds 1 and 2 into one pipe, runs the request's prelude (Python code, as a ``python -c`` script
that patches a module before it runs run.py) if any, runs run.py as ``__main__`` and exits with the status Python
would give (``SystemExit`` code; an uncaught exception: its traceback on stderr and 1). The answer,
(exit status, output bytes) or a timeout, goes back on stdout. ``Zygote.run`` is the client side.

``Zygote.popen`` starts a command the same way without waiting for it (a run.py or ``python -m MODULE``
that a test reads line by line, signals or runs beside another): its output goes to a FIFO the client
reads, the child may lead a session of its own, and the zygote, its parent, reaps it on request.
"""
import os
import pickle
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = os.path.join(ROOT, "run.py")


def _send(stream, obj) -> None:
    data = pickle.dumps(obj)
    stream.write(struct.pack("!Q", len(data)) + data)
    stream.flush()


def _receive(stream):
    head = stream.read(8)
    if len(head) < 8:
        return None
    return pickle.loads(stream.read(struct.unpack("!Q", head)[0]))


def _child(cwd: str, env: dict, args: list, prelude: str | None, write_fd: int, module: str | None = None,
           new_session: bool = False) -> None:
    """In the forked child: become ``python run.py ARGS`` (``python -m MODULE ARGS`` with ``module``), in
    a session of its own with ``new_session``, and never return."""
    import atexit
    import runpy
    import threading
    import traceback
    code = 1
    try:
        if new_session:
            os.setsid()
        os.dup2(write_fd, 1)
        os.dup2(write_fd, 2)
        os.close(write_fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        sys.argv = [RUN if module is None else module, *args]
        sys.path[0] = ROOT if module is None else cwd
        try:
            if prelude:
                exec(compile(prelude, "<string>", "exec"), {"__name__": "__main__"})
            if module is None:
                runpy.run_path(RUN, run_name="__main__")
            else:                         # as python -m: the module runs anew as __main__
                sys.modules.pop(module, None)
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            if exc.code is None:
                code = 0
            elif isinstance(exc.code, int):
                code = exc.code & 0xFF
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException as exc:      # as the interpreter reports it: the frames from run.py's on
            tb = exc.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename in (__file__, "<frozen runpy>"):
                tb = tb.tb_next
            traceback.print_exception(type(exc), exc, tb)     # none for run.py's own SyntaxError
            code = 1
        threading._shutdown()             # the interpreter's exit: threads, atexit, flushed streams
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _serve() -> None:
    import select
    import signal
    import time
    requests = os.fdopen(os.dup(0), "rb")
    answers = os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(null, fd)
    os.close(null)
    while (request := _receive(requests)) is not None:
        kind, *request = request
        if kind == "wait":                   # (pid, timeout): reap a command started by "popen"
            pid, timeout = request
            deadline = time.monotonic() + timeout
            while (status := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
                time.sleep(0.02)
            _send(answers, ("done", os.waitstatus_to_exitcode(status[1])) if status[0] else ("timeout", None))
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        if kind == "popen":                  # (cwd, env, args, module, FIFO, new session): start, answer its pid
            cwd, env, args, module, fifo, new_session = request
            write_fd = os.open(fifo, os.O_WRONLY)      # the client holds the FIFO open for reading
            pid = os.fork()
            if pid == 0:
                requests.close()
                answers.close()
                _child(cwd, env, args, None, write_fd, module, new_session)
            os.close(write_fd)
            _send(answers, ("started", pid))
            continue
        cwd, env, args, timeout, prelude = request
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            requests.close()
            answers.close()
            os.close(read_fd)
            _child(cwd, env, args, prelude, write_fd)
        os.close(write_fd)
        chunks, deadline, timed_out = [], time.monotonic() + timeout, False
        while True:                      # as subprocess.run: read to EOF, then wait
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([read_fd], [], [], left)[0]:
                timed_out = True
                os.kill(pid, signal.SIGKILL)
                break
            chunk = os.read(read_fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        os.close(read_fd)
        status = os.waitpid(pid, 0)[1]
        rc = os.waitstatus_to_exitcode(status)
        _send(answers, ("timeout" if timed_out else "done", rc, b"".join(chunks)))


def _warm() -> None:
    """Compute here, once, what each command computes once per process from files that no test changes:
    MLflow's schema head, the metric table, the tool versions (by path), the compiled kernel templates."""
    import importlib

    import experiments.metrics
    import experiments.build.toolchain
    import experiments.store.track
    from experiments.families import base
    render = importlib.import_module("experiments.families.mma_sync.render")
    experiments.store.track._schema_head()
    experiments.metrics.table()
    experiments.build.toolchain.toolchain_tags()
    for template in sorted(p.name for p in base.TEMPLATE_DIR.glob("*.j2")):
        base._env().get_template(template)
    render._env().get_template(render.FAMILY_TEMPLATE)


class Zygote:
    """Client of one zygote process, started on the first ``run`` with environment ``env``."""

    def __init__(self, env: dict):
        import threading
        self.env = dict(env)
        self.proc = None
        self.lock = threading.Lock()         # one request at a time

    def _ask(self, request: tuple) -> tuple:
        import subprocess
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__)], env=self.env,
                                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            _send(self.proc.stdin, request)
            answer = _receive(self.proc.stdout)
        if answer is None:
            raise RuntimeError("the zygote process ended")
        return answer

    def run(self, cwd, args, env: dict, timeout: float, prelude: str | None = None) -> tuple:
        """(status, output bytes) of ``python run.py ARGS`` in ``cwd`` with environment ``env``, after
        the Python code ``prelude`` if given; raises subprocess.TimeoutExpired after ``timeout`` seconds
        (the child is killed)."""
        import subprocess
        kind, rc, output = self._ask(("run", str(cwd), dict(env), [str(a) for a in args], timeout, prelude))
        if kind == "timeout":
            raise subprocess.TimeoutExpired([sys.executable, RUN, *args], timeout, output)
        return rc, output

    def popen(self, cwd, args, env: dict, module: str | None = None, start_new_session: bool = False):
        """``python run.py ARGS`` (``python -m MODULE ARGS``) in ``cwd`` started and not waited for, as a
        :class:`Started`: what ``subprocess.Popen(..., text=True, stdout=PIPE, stderr=STDOUT)`` gives."""
        import tempfile
        folder = tempfile.mkdtemp(prefix="zygote-")
        fifo = os.path.join(folder, "out")
        os.mkfifo(fifo)
        read_fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)     # open before the writer: no EOF yet
        try:
            _, pid = self._ask(("popen", str(cwd), dict(env), [str(a) for a in args], module, fifo,
                                start_new_session))
        finally:
            os.unlink(fifo)
            os.rmdir(folder)
        os.set_blocking(read_fd, True)
        return Started(self, pid, read_fd, [module or RUN, *map(str, args)])

    def wait(self, pid: int, timeout: float | None) -> int | None:
        """The exit status of the command ``pid`` that :meth:`popen` started, or None after ``timeout``
        seconds (None: no limit)."""
        kind, rc = self._ask(("wait", pid, 1e9 if timeout is None else timeout))
        return rc if kind == "done" else None

    def close(self) -> None:
        """Ends the zygote process and waits for it (its CPU time then counts for this process)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait()


class Started:
    """A command :meth:`Zygote.popen` started, used as a ``subprocess.Popen`` with text output: ``pid``,
    ``stdout`` (stdout and stderr), ``returncode``, ``poll``, ``wait``, ``communicate``, ``send_signal``,
    ``terminate``, ``kill``. Only the zygote, its parent, can wait for it."""

    def __init__(self, zygote: Zygote, pid: int, read_fd: int, args: list):
        import locale
        self.zygote, self.pid, self.args, self.returncode = zygote, pid, args, None
        self.stdout = open(read_fd, encoding=locale.getpreferredencoding(False))  # noqa: SIM115
        self._read = None

    def poll(self) -> int | None:
        return self.wait(0) if self.returncode is None else self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        import subprocess
        if self.returncode is None:
            self.returncode = self.zygote.wait(self.pid, timeout)
            if self.returncode is None and timeout != 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple:
        """(all output, None) once the command ended; subprocess.TimeoutExpired after ``timeout`` s."""
        import subprocess
        import threading
        import time
        start = time.monotonic()
        if self._read is None:
            out: list = []
            self._read = (threading.Thread(target=lambda: out.append(self.stdout.read()), daemon=True), out)
            self._read[0].start()
        self._read[0].join(timeout)
        if self._read[0].is_alive():
            raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if timeout is None else max(1.0, timeout - (time.monotonic() - start)))
        return self._read[1][0], None

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        import signal
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        import signal
        self.send_signal(signal.SIGKILL)


if __name__ == "__main__":
    sys.path[0] = ROOT                    # experiments from this tree, as for python run.py
    import hydra  # noqa: F401
    import omegaconf  # noqa: F401
    import mlflow  # noqa: F401
    import mlflow.store.tracking.sqlalchemy_store  # noqa: F401
    import experiments.config  # noqa: F401
    import experiments.runner.job  # noqa: F401
    import experiments.runner.sweep  # noqa: F401
    import experiments.store.track  # noqa: F401
    import experiments.gpu.worker  # noqa: F401
    from experiments.store.record import plotting
    plotting()                            # what each sweep imports in a background thread (seconds)
    _warm()
    import gc
    gc.freeze()         # what is here now is never garbage: no child's collections walk it (~15% of their CPU)
    _serve()
