"""A warm trainer: runs kiln_gpu.train for kiln-train without paying the
interpreter's start-up and torch's and transformers' imports each time
(docs/train-stage.md §8.1).

    python -m kiln_gpu.forkserver --socket PATH [--preload MODEL_DIR]

It imports torch, transformers and kiln_gpu.train once (with --preload,
also the modeling code of MODEL_DIR's architecture), listens on the Unix
socket PATH (mode 0600) and, for each request, forks a child that runs
kiln_gpu.train's main on the request's plan, in a process group of its own,
as `python -m kiln_gpu.train --plan PLAN` would: the same code, the same
exit status. The fork shares what the imports built and nothing a run
leaves behind: every run is a fresh child.

The protocol, one connection per run (kiln-train --trainer-socket speaks
it; stages/train/forkserver.go):

1. the client sends one JSON line, {"plan": ABS_PATH, "cwd": DIR,
   "env": {NAME: VALUE}}, with three file descriptors attached
   (SCM_RIGHTS): the run's stdin, stdout and stderr;
2. the server answers {"pid": N} when the child is started, or
   {"error": TEXT} when the request is refused;
3. when the child exits it answers {"exit": CODE} (negative: the signal
   that killed it) and closes the connection.

A client that closes its connection before the exit line cancels the run:
the child's process group is killed (SIGKILL). The children die with the
server (PR_SET_PDEATHSIG), and SIGTERM or SIGINT to the server kills them
and stops it. The code a child runs is the code the server imported: after
changing gpu/, restart it.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import selectors
import signal
import socket
import stat
import sys
from pathlib import Path

MAX_REQUEST = 64 << 10


def _die_with_parent() -> None:
    """PR_SET_PDEATHSIG(SIGKILL): the child dies when the server does."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: the server's own SIGTERM handler still kills its children


def _reply(conn: socket.socket, obj: dict) -> None:
    try:
        conn.setblocking(True)
        conn.sendall((json.dumps(obj) + "\n").encode())
    except OSError:
        pass  # the client is gone; its run was killed or has ended


def _request(conn: socket.socket) -> tuple[dict, list[int]]:
    """One request line and its three descriptors; ValueError says what
    is wrong with it."""
    fds: list[int] = []
    buf = b""
    while not buf.endswith(b"\n"):
        msg, anc, _, _ = conn.recvmsg(MAX_REQUEST, socket.CMSG_LEN(3 * 4))
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds += [int.from_bytes(data[i:i + 4], sys.byteorder) for i in range(0, len(data) - len(data) % 4, 4)]
        if not msg:
            break
        buf += msg
        if len(buf) > MAX_REQUEST:
            raise ValueError(f"a request line longer than {MAX_REQUEST} bytes")
    if not buf:
        raise EOFError  # a connection that asked nothing (a health check)
    if len(fds) != 3:
        for fd in fds:
            os.close(fd)
        raise ValueError(f"want 3 file descriptors (stdin, stdout, stderr) with the request, got {len(fds)}")
    try:
        req = json.loads(buf)
        if not isinstance(req, dict) or not isinstance(req.get("plan"), str) or not os.path.isabs(req["plan"]):
            raise ValueError('want {"plan": ABSOLUTE_PATH, "cwd": DIR, "env": {...}}')
        if not isinstance(req.get("cwd", "/"), str) or not isinstance(req.get("env", {}), dict):
            raise ValueError('"cwd" must be a string and "env" an object of strings')
    except ValueError:
        for fd in fds:
            os.close(fd)
        raise
    return req, fds


def _child(req: dict, fds: list[int], listener: socket.socket, conns: list[socket.socket]) -> None:
    """The forked run: never returns."""
    code = 1
    try:
        os.setpgid(0, 0)
        _die_with_parent()
        for s in [listener, *conns]:
            s.close()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        for i, fd in enumerate(fds):
            os.dup2(fd, i)
            os.close(fd)
        os.chdir(req.get("cwd", "/"))
        os.environ.update({str(k): str(v) for k, v in req.get("env", {}).items()})
        from . import train

        code = train.main(["--plan", req["plan"]])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve(path: str) -> int:
    p = Path(path)
    if p.exists():
        probe = socket.socket(socket.AF_UNIX)
        try:
            probe.connect(path)
            print(f"kiln_gpu.forkserver: {path} is in use by another server; stop it or pass another --socket",
                  file=sys.stderr)
            return 2
        except OSError:
            if not stat.S_ISSOCK(p.lstat().st_mode):
                print(f"kiln_gpu.forkserver: {path} exists and is not a socket", file=sys.stderr)
                return 2
            p.unlink()  # a dead server's socket
        finally:
            probe.close()
    listener = socket.socket(socket.AF_UNIX)
    old = os.umask(0o177)
    try:
        listener.bind(path)
    finally:
        os.umask(old)
    listener.listen(16)
    listener.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    runs: dict[int, socket.socket] = {}  # child pid -> its client's connection
    stopping = False

    def stop(*_):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"kiln_gpu.forkserver: listening on {path}", file=sys.stderr, flush=True)
    try:
        while not stopping:
            for key, _ in sel.select(timeout=0.2):
                s = key.fileobj
                if s is listener:
                    try:
                        conn, _ = listener.accept()
                    except BlockingIOError:
                        continue
                    conn.setblocking(True)
                    conn.settimeout(10)
                    try:
                        req, fds = _request(conn)
                    except EOFError:
                        conn.close()
                        continue
                    except (ValueError, OSError) as e:
                        _reply(conn, {"error": str(e)})
                        conn.close()
                        continue
                    sys.stdout.flush()
                    sys.stderr.flush()
                    pid = os.fork()
                    if pid == 0:
                        _child(req, fds, listener, list(runs.values()) + [conn])
                    for fd in fds:
                        os.close(fd)
                    print(f"kiln_gpu.forkserver: run {pid}: {req['plan']}", file=sys.stderr, flush=True)
                    _reply(conn, {"pid": pid})
                    conn.setblocking(False)
                    runs[pid] = conn
                    sel.register(conn, selectors.EVENT_READ, pid)
                else:
                    # the client said something after its request, or left:
                    # either way the run is over for it
                    try:
                        data = s.recv(4096)
                    except BlockingIOError:
                        continue
                    except OSError:
                        data = b""
                    if not data:
                        try:
                            os.killpg(key.data, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
            while runs:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                conn = runs.pop(pid, None)
                print(f"kiln_gpu.forkserver: run {pid}: exit {os.waitstatus_to_exitcode(status)}", file=sys.stderr,
                      flush=True)
                if conn is not None:
                    sel.unregister(conn)
                    _reply(conn, {"exit": os.waitstatus_to_exitcode(status)})
                    conn.close()
    finally:
        for pid in runs:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        listener.close()
        try:
            p.unlink()
        except FileNotFoundError:
            pass
    return 0


def preload(model_dir: str) -> None:
    """Imports the modeling code of model_dir's architecture (config.json),
    which transformers otherwise imports on the first from_pretrained."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    MODEL_FOR_CAUSAL_LM_MAPPING[type(AutoConfig.from_pretrained(model_dir))]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m kiln_gpu.forkserver", description=__doc__.split("\n\n")[0])
    p.add_argument("--socket", required=True, help="the Unix socket to listen on (kiln-train --trainer-socket)")
    p.add_argument("--preload", metavar="MODEL_DIR",
                   help="also import the modeling code of this checkpoint's architecture")
    a = p.parse_args(argv)
    import torch  # noqa: F401  (the imports a run would pay for)
    import transformers  # noqa: F401

    from . import train  # noqa: F401

    if a.preload:
        try:
            preload(a.preload)
        except (OSError, ValueError, KeyError) as e:
            print(f"kiln_gpu.forkserver: --preload {a.preload!r}: {e}", file=sys.stderr)
            return 2
    return serve(a.socket)


if __name__ == "__main__":
    sys.exit(main())
