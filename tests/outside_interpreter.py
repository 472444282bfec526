"""Run Python outside Triton's interpreter from a test that runs inside it.

The ahead-of-time checks (sm_90 compiles, no GPU) need a process without
`TRITON_INTERPRET`. One such process per test worker imports torch, Triton and
stitchml once (~5 s of CPU on the 2-core machine) and forks a child for every script,
so each script starts from that clean, imported state: no knob, cache or module state
of one script reaches the next, and ~24 checks stop paying for ~24 imports.
"""
from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# the server: read one JSON request a line, fork, run it in the child with the request's
# environment, argv and output files, answer with the child's exit status
_SERVER = r"""
import json, os, runpy, sys, traceback
import torch, triton, triton.backends.nvidia.compiler
import stitchml.tools.aot_check, stitchml.tools.examples
print("ready", flush=True)
for line in sys.stdin:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.environ.clear()
            os.environ.update(req["env"])
            for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
                f = os.open(path, os.O_WRONLY | os.O_TRUNC)
                os.dup2(f, fd)
                os.close(f)
            sys.argv = req["argv"]
            if req["module"]:
                runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
            else:
                exec(compile(req["script"], "<script>", "exec"), {"__name__": "__main__"})
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status), flush=True)
"""

_server: subprocess.Popen | None = None


def _base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _stop() -> None:
    global _server
    if _server is not None and _server.poll() is None:
        _server.stdin.close()
        try:
            _server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(_server.pid, signal.SIGKILL)
    _server = None


def _start() -> subprocess.Popen:
    global _server
    if _server is None or _server.poll() is not None:
        _server = subprocess.Popen([sys.executable, "-c", _SERVER], cwd=ROOT, env=_base_env(), text=True,
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
        atexit.register(_stop)
        assert _read_line(_server, 300) == "ready"
    return _server


def _read_line(server: subprocess.Popen, timeout: float) -> str:
    ready, _, _ = select.select([server.stdout], [], [], timeout)
    if not ready:   # the child hangs: kill the server and its children, start afresh next time
        os.killpg(server.pid, signal.SIGKILL)
        _stop()
        raise TimeoutError(f"no answer outside the interpreter within {timeout} s")
    line = server.stdout.readline()
    assert line, "the outside-the-interpreter server died"
    return line.strip()


def run(script: str | None = None, *, module: str | None = None, args: tuple[str, ...] = (),
        env: dict[str, str] | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    """`python -c script` or `python -m module args...` without TRITON_INTERPRET, in the
    repository root, with `env` added to this process's environment."""
    pytest.importorskip("triton.backends.nvidia")
    server = _start()
    with tempfile.TemporaryDirectory() as d:
        out, err = os.path.join(d, "stdout"), os.path.join(d, "stderr")
        for path in (out, err):
            open(path, "w").close()
        argv = [module or "-c", *args]
        server.stdin.write(json.dumps({"env": {**_base_env(), **(env or {})}, "stdout": out, "stderr": err,
                                       "argv": argv, "module": module, "script": script}) + "\n")
        server.stdin.flush()
        code = int(_read_line(server, timeout))
        return subprocess.CompletedProcess(argv, code, Path(out).read_text(), Path(err).read_text())


def last_json_line(script: str) -> dict:
    """Run `script` outside the interpreter; its last stdout line is JSON."""
    proc = run(script)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
