"""The in-sandbox agent: the first program of every worker, started before any code arrives.

Runs inside the sandbox as `python -I -S -c BOOT <this source> <config>` (stdlib only; it never
imports agentrl). Its start-up is paid by every worker (each one-shot call, each session), so it
imports only C modules: `_signal`, `_ast` and `marshal` instead of `signal`, `ast` and `json` took
a start from 18.7 to 8.8 ms of CPU here. It adds the configured site-packages to sys.path, imports
`preload` modules, says `ready` and waits. Frames on the inherited unix socket are a 4-byte
big-endian length + a body: from the server `marshal` (version 2; the config on the command line
is its hex), which only the agent reads (the server is trusted); to the server UTF-8 JSON written
by `_dumps`, which the server parses as untrusted input (`sandbox/worker.py`):

    agent -> server  {"ready": true}
    server -> agent  {"code", "language", "mode": "oneshot"|"session", "timeout", "cpu_s",
                      "marker", "cell"}
    agent -> server  {"exit_code", "error_name", "error_value", "result", "timed_out"}

One-shot: the code runs as `__main__` (like `python -c`), the reply is sent and the server kills
the sandbox. Session: the code runs in one namespace kept across calls; a trailing expression's
repr is returned as `result`; after each call the agent writes `marker` to fd 1 and 2 so the
server can cut the output of this call from the next. The agent runs in the same process as the
code, so nothing it reports is trusted for grading (see sandbox/grader.py).
"""

# ruff: noqa: SIM105  (contextlib.suppress would cost an import on every worker start)
import _signal as signal  # the C module: `signal` imports enum
import marshal
import os
import resource
import sys

# linecache and traceback are imported when first needed (an exception to print)

AGENT_FILE = "<sandbox-agent>"
# a value's repr and an exception's text, cut so that the reply frame always fits what the
# server accepts (64 K characters a field, 256 KB a frame; a character is at most 6 bytes in
# the frame): a large trailing value is the code's ordinary result, never a forged frame
_MAX_REPR = 8 * 1024


class CellTimeout(BaseException):
    """Raised in the code by the agent's alarm when a session call runs past its time."""


class CellCpuLimit(BaseException):
    """Raised in the code by SIGXCPU (a session call past its CPU seconds)."""


def _alarm(signum, frame):
    raise CellTimeout()


def _xcpu(signum, frame):
    raise CellCpuLimit()


def _recv(fd):
    head = _exact(fd, 4)
    if head is None:
        return None
    body = _exact(fd, int.from_bytes(head, "big"))
    return None if body is None else marshal.loads(body)


def _exact(fd, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


_ESC = {i: f"\\u{i:04x}" for i in range(32)}
_ESC[34], _ESC[92] = '\\"', "\\\\"


def _json_str(text):
    out = str.translate(text, _ESC)
    try:
        out.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates (from the code's own strings): escaped
        out = "".join(c if not 0xD800 <= ord(c) < 0xE000 else f"\\u{ord(c):04x}" for c in out)
    return '"' + out + '"'


def _dumps(obj):
    """JSON of a reply: dicts, lists, str, int, float, bool, None (no `json` import)."""
    if obj is None or obj is True or obj is False:
        return "null" if obj is None else "true" if obj else "false"
    if isinstance(obj, int):
        return int.__repr__(obj)
    if isinstance(obj, float):
        return float.__repr__(obj) if obj - obj == 0 else "null"  # inf and nan are not JSON
    if isinstance(obj, str):
        return _json_str(obj)
    if isinstance(obj, (list, tuple)):
        return "[" + ",".join(_dumps(x) for x in obj) + "]"
    if isinstance(obj, dict):
        return "{" + ",".join(_json_str(str(k)) + ":" + _dumps(v) for k, v in obj.items()) + "}"
    return _json_str(str(obj))


def _send(fd, obj):
    data = _dumps(obj).encode()
    view = memoryview(len(data).to_bytes(4, "big") + data)
    while view:
        view = view[os.write(fd, view) :]


def _print_exception(e, name, code):
    import linecache
    import traceback

    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == AGENT_FILE:
        tb = tb.tb_next
    try:
        sys.stderr.write("".join(traceback.format_exception(type(e), e, tb)))
    except BaseException:
        os.write(2, f"{type(e).__name__}\n".encode())


def _exit_status(code):
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        sys.stderr.write(f"{code}\n")
    except BaseException:
        pass
    return 1


def _repr(value):
    try:
        text = repr(value)
    except BaseException as e:
        text = f"<repr failed: {type(e).__name__}>"
    return _cut(text)


def _cut(text):
    if len(text) <= _MAX_REPR:
        return text
    return text[: _MAX_REPR - 48] + f"...[{len(text)} characters, cut]"


def run_cell(code, ns, name, repl):
    out = {"exit_code": 0, "error_name": None, "error_value": None, "result": None}
    out["timed_out"] = False
    try:
        last = None
        if repl:
            import _ast as ast  # the C module: `ast` imports enum and contextlib

            tree = compile(code, name, "exec", ast.PyCF_ONLY_AST)
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            exec(compile(tree, name, "exec"), ns)
        else:
            exec(compile(code, name, "exec"), ns)
        if last is not None:
            value = eval(compile(last, name, "eval"), ns)
            if value is not None:
                ns["_"] = value
                out["result"] = _repr(value)
    except SystemExit as e:
        out["exit_code"] = _exit_status(e.code)
    except CellTimeout:
        out.update(exit_code=None, timed_out=True, error_name="TimeoutError")
        out["error_value"] = "execution timed out"
        _safe_write("TimeoutError: execution timed out\n")
    except CellCpuLimit:
        out.update(exit_code=None, limit="cpu_time", error_name="CPUTimeLimitExceeded")
        out["error_value"] = "CPU time limit exceeded"
        _safe_write("CPUTimeLimitExceeded: CPU time limit exceeded\n")
    except BaseException as e:
        _print_exception(e, name, code)
        out.update(exit_code=1, error_name=type(e).__name__, error_value=_safe_str(e))
        if isinstance(e, OSError) and isinstance(e.errno, int):
            out["errno"] = e.errno
    return out


def _safe_str(e):
    try:
        return _cut(str(e))
    except BaseException:
        return ""


def _safe_write(text):
    try:
        sys.stderr.write(text)
    except BaseException:
        pass


def _flush():
    for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            s.flush()
        except BaseException:
            pass


def _limit_cpu(cpu_s, hard, oneshot):
    """Per-call CPU budget: SIGXCPU at `cpu_s` more seconds (SIGKILL one second later). The
    code may raise this soft limit (to `hard`): the server watches the budget from outside too
    (sandbox/cpuwatch.py); this is the first line, exact to the next whole second."""
    used = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
    soft = -int(-(used + cpu_s) // 1)  # ceil
    hard = soft + 1 if oneshot else hard
    soft = min(soft, hard)
    try:
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
    except (ValueError, OSError):
        pass


def serve(fd, cfg):
    ns = {"__name__": "__main__", "__builtins__": __builtins__}
    cpu_hard = int(cfg.get("session_cpu_s", 600))
    cells = 0
    while True:
        req = _recv(fd)
        if req is None:
            os._exit(0)
        oneshot = req["mode"] == "oneshot"
        # one-shot: SIGXCPU kills (flagged by the server); session: it interrupts the call only
        signal.signal(signal.SIGXCPU, signal.SIG_DFL if oneshot else _xcpu)
        _limit_cpu(req["cpu_s"], cpu_hard, oneshot)
        if req.get("language") == "bash":
            os.close(fd)
            os.execv("/bin/bash", ["bash", "-c", req["code"]])
        cells += 1
        if not oneshot and req.get("timeout"):
            signal.setitimer(signal.ITIMER_REAL, req["timeout"])
        name = "<string>" if oneshot else f"<cell {cells}>"
        try:
            try:
                out = run_cell(req["code"], ns, name, repl=not oneshot)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                # the server's CPU watch may send SIGXCPU as the cell ends; between calls it
                # would end the agent (in _send or _recv), so until the next call it is ignored
                signal.signal(signal.SIGXCPU, signal.SIG_IGN)
        except (CellTimeout, CellCpuLimit):  # fired between the cell's end and here
            out = {"exit_code": 0, "timed_out": False}
        _flush()
        marker = req.get("marker")
        if marker:
            for out_fd in (1, 2):
                try:
                    os.write(out_fd, marker.encode())
                except OSError:
                    out["marker_lost"] = True
        _send(fd, out)
        if oneshot:  # the server kills the sandbox now; wait for that rather than race it
            _recv(fd)
            os._exit(0)


def main():
    cfg = marshal.loads(bytes.fromhex(sys.argv[2]))
    sys.path.extend(p for p in cfg.get("paths", []) if p not in sys.path)
    fd = cfg["fd"]
    os.set_inheritable(fd, False)
    sys.argv = ["-c"]
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # past the file-size limit: killed, flagged
    signal.signal(signal.SIGALRM, _alarm)
    warnings = []
    for mod in cfg.get("preload", []):
        try:
            __import__(mod)
        except BaseException as e:
            warnings.append(f"preload {mod} failed: {type(e).__name__}: {e}")
    _send(fd, {"ready": True, "warnings": warnings})
    serve(fd, cfg)


main()
