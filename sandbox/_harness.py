# The grader's harness: the program of one sandbox call, never imported. `sandbox/grader.py:
# harness_code` reads this file as text and fills the __NAMES__ (the test's spec, the runners,
# the helpers it shares with the grader, the limits) before sending it. It runs inside the
# sandbox, one test per call, and never sees an expected answer.
# ruff: noqa
import time

T0 = time.monotonic()
import ctypes, hashlib, json, os, re, signal, sys

SPEC = json.loads(__SPEC__)
NONCE = SPEC.pop("nonce")
TEST = SPEC["test"]
IDS = TEST["i"] if isinstance(TEST["i"], list) else [TEST["i"]]  # a batch: one frame a test
# each test's share of the report the sandbox keeps, its line included (the grader caps a
# batch's tests so that a share holds a frame with its texts cut): what a solution makes its
# frames hold (errors, values, output) can cost its own texts, never the report
ROOM = min(__REPORT_BYTES__ // len(IDS), __COMPACT_BYTES__ if SPEC["compact"] else 1 << 30)
try:
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: children can't read our memory
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: daemons stay our children
except Exception:
    pass
KEEP = {
    signal.SIGKILL,
    signal.SIGSTOP,
    signal.SIGCHLD,
    signal.SIGPIPE,
    signal.SIGCONT,
    signal.SIGSEGV,
    signal.SIGBUS,
    signal.SIGFPE,
    signal.SIGILL,
    signal.SIGABRT,
    signal.SIGSYS,
    signal.SIGTRAP,
    signal.SIGXCPU,
    signal.SIGXFSZ,
}
for s in signal.valid_signals():  # SIGINT, SIGALRM, SIGTERM, SIGTSTP...: a no-op handler (not
    if s not in KEEP:  # SIG_IGN: exec resets handlers, so the child gets defaults)
        try:
            signal.signal(s, lambda *a: None)
        except (OSError, ValueError, RuntimeError):
            pass
REAL_OUT = os.dup(1)
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
WORK = os.path.join(os.environ.get("TMPDIR") or "/tmp", "h-" + os.urandom(8).hex())
os.mkdir(WORK, 0o700)
SOL = os.path.join(WORK, "solution.py")
with open(SOL, "wb") as f:  # a lone surrogate fails to load there, not here
    f.write(SPEC["solution"].encode("utf-8", "surrogatepass"))
REPO = os.path.join(WORK, "repo")  # a repository's files (grade(files=...)): first on the path
for rel, text in (SPEC.get("files") or {}).items():
    dest = os.path.join(REPO, rel)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with open(dest, "wb") as f:
        f.write(text.encode("utf-8", "surrogatepass"))
PATHS = "\n".join(([REPO] if SPEC.get("files") else []) + [p for p in sys.path if p])
IO_RUNNER, CALL_RUNNER = __IO_RUNNER__, __CALL_RUNNER__
__HELPERS__


def encode(rec):
    # UTF-8 JSON; a lone surrogate goes out as its JSON escape \udXXX (backslashreplace)
    return json.dumps(rec, ensure_ascii=False).encode("utf-8", "backslashreplace")


def fit(rec, room):
    """The frame in `room` bytes: its texts cut, longest first, each to the most characters
    that fit (a binary search), the cut said in the text; its value already went (a hash)."""
    for key in sorted({"err", "e", "p", "harness"} & set(rec), key=lambda k: -len(str(rec[k]))):
        if len(encode(rec)) <= room:
            break
        text, lo, hi = str(rec[key]), 0, len(str(rec[key]))
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if len(encode(dict(rec, **{key: clip(text, mid)}))) <= room:
                lo = mid
            else:
                hi = mid - 1
        rec[key] = clip(text, lo)
    return encode(rec)


def emit(rec):
    line = encode(rec)
    room = ROOM - len(NONCE) - 3  # the line's newlines and nonce
    if "v" in rec and not SPEC["compact"] and len(line) > room:
        lean = {"v": rec["v"], "t": rec["t"]}  # its hash, preview and truth follow from v
        if len(encode(lean)) <= room:  # (the grader computes them): a value keeps its tolerance
            rec, line = lean, encode(lean)
    if "t" in rec and (SPEC["compact"] or len(line) > room):  # a frame: it must fit its share
        if len(line) > room:
            rec["cut"] = 1  # the grader notes it
        rec.pop("v", None)  # a value past it is compared through its hash
        line = fit(rec, room)
    data = memoryview(b"\n" + NONCE.encode() + b" " + line + b"\n")
    while data:
        data = data[os.write(REAL_OUT, data) :]


def contained():
    # the bwrap sandbox's own PID namespace: its init is pid 1 and we are its child, pid 2
    try:
        with open("/proc/1/comm") as f:
            return os.getpid() == 2 and os.getppid() == 1 and f.read().strip() == "bwrap"
    except OSError:
        return False


CONTAINED = contained()
STARTED = []  # not empty once the solution's process exists: what fails after is its doing


def tmpfile():
    path = os.path.join(WORK, os.urandom(8).hex())
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.unlink(path)
    return fd


def read(fd, limit, tail=False):
    return os.pread(fd, limit, max(0, os.fstat(fd).st_size - limit) if tail else 0)


def spawn(argv, fds, cwd, keep_fd):
    env = dict(os.environ, TMPDIR=cwd)
    pid = os.fork()
    if pid == 0:  # the child: a fresh interpreter in its own session, default signals
        try:
            os.setsid()
            os.chdir(cwd)
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
            os.closerange(3, keep_fd if keep_fd > 2 else 3)
            os.closerange(max(3, keep_fd + 1), 65536)
            if keep_fd > 2:
                os.set_inheritable(keep_fd, True)
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)
            signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
            os.execve(sys.executable, argv, env)
        finally:
            os._exit(127)
    return pid


def wait(pid, deadline):
    delay = 0.001
    while True:
        got, status = os.waitpid(pid, os.WNOHANG)
        if got:
            return os.waitstatus_to_exitcode(status)
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        time.sleep(min(delay, left))
        delay = min(2 * delay, 0.02)


def kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def kill_all(pid, reaped):
    kill(-1 if CONTAINED else -pid)  # -1: every process here but us and init, in one pass
    if not reaped:  # that no fork escapes; -pid: the solution's session
        os.waitpid(pid, 0)
    end = time.monotonic() + (0 if CONTAINED else 2.0)
    while time.monotonic() < end:  # elsewhere, best effort: descendants re-parented to us
        kids = []
        for k in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open("/proc/%s/stat" % k, "rb") as f:
                    stat = f.read()
                if int(stat[stat.rindex(b")") + 2 :].split()[1]) == os.getpid():
                    kids.append(int(k))
            except (OSError, ValueError):
                pass
        for k in kids:
            kill(k)
            try:
                os.waitpid(k, 0)
            except OSError:
                pass
        if not kids:
            return


def run(argv, stdin_text, keep_stdout=True, keep_fd=-1):
    cwd = os.path.join(WORK, "t")
    os.mkdir(cwd)
    inp, err = tmpfile(), tmpfile()
    os.write(inp, stdin_text.encode())
    os.lseek(inp, 0, 0)
    out = tmpfile() if keep_stdout else os.open(os.devnull, os.O_WRONLY)
    if time.monotonic() - T0 > __START_S__:  # leave the clean-up its time within the call's
        raise RuntimeError("the sandbox started the harness too slowly")
    emit({"s": TEST["i"]})  # the solution starts now
    t0 = time.monotonic()
    pid = spawn(argv, (inp, out, err), cwd, keep_fd)  # a fork refused (pids) is not its doing
    STARTED.append(True)
    rc = wait(pid, t0 + SPEC["timeout"])
    kill_all(pid, rc is not None)  # before anything it left is read: none of it runs any more
    to = rc is None or rc == -signal.SIGXCPU
    stdout = read(out, 16 << 20) if keep_stdout else b""
    return rc, to, stdout, read(err, 300, tail=True).decode("utf-8", "replace")[-160:]


def io_test():
    argv = [sys.executable, "-I", "-S", "-c", IO_RUNNER, SOL, PATHS]
    rc, to, out, err = run(argv, TEST["stdin"])
    text = normalize_output(out.decode("utf-8", "replace"))
    return {"h": _sha(text), "p": text[:80], "rc": rc, "to": to, "e": err}


def call_test():
    batch = "calls" in TEST  # several calls in one interpreter: one frame each, in order
    calls = TEST["calls"] if batch else [TEST["call"]]
    res = tmpfile()
    argv = [
        sys.executable,
        "-I",
        "-S",
        "-c",
        CALL_RUNNER,
        SOL,
        PATHS,
        json.dumps(calls),
        SPEC.get("entry") or "",
        str(res),
    ]
    rc, to, _, err = run(argv, "", keep_stdout=False, keep_fd=res)
    lines = read(res, 16 << 20).decode("utf-8", "replace").splitlines()
    if len(lines) > len(calls):  # written by the solution itself: no result is its own
        frames = [{"err": "more results than calls", "forged": True}] * len(calls)
    else:
        frames = [frame_of(line, SPEC.get("inline") or __INLINE__) for line in lines]
    for _ in range(len(calls) - len(frames)):  # the calls it never finished
        frames.append(
            {"err": "timeout"}
            if to
            else {"missing": True, "rc": rc, "e": err or "no result (exit %s)" % rc}
        )
    return frames if batch else frames[0]


def frame_of(line, inline):
    try:
        rec = json.loads(line)
        if not isinstance(rec, dict) or len(rec) != 1 or not {"v", "err"} & set(rec):
            raise ValueError("not a result")
        if "err" in rec:
            return {"err": clip(str(rec["err"]), 200)}
        text = json.dumps(rec["v"], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (ValueError, TypeError, RecursionError):  # the runner writes none: the solution did
        return {"err": "unreadable result", "forged": True}
    except MemoryError:
        return {"err": "result too large to read"}
    frame = {"h": _sha(text), "p": text[:80], "b": _truthy(rec["v"])}
    if len(text) <= inline and shallow(rec["v"], 120):
        frame["v"] = rec["v"]
    return frame


def shallow(v, left):
    # no deeper than canon writes (50 levels, two JSON levels each at most): a solution that
    # wrote its own 990-deep report had the grader's json.loads raise RecursionError in the
    # trainer (a reward_error that counts toward stopping the run); deeper goes as a hash only
    if isinstance(v, dict):
        v = list(v.values())
    return not isinstance(v, list) or (left > 0 and all(shallow(x, left - 1) for x in v))


try:
    frame = io_test() if SPEC["kind"] == "io" else call_test()
except BaseException as e:
    why = "%s: %s" % (type(e).__name__, e)
    if STARTED:  # on what the solution left (16 MB of newlines past its memory): its failure
        frame = {"err": clip("the harness failed on the solution's output: " + why, 200)}
    else:  # a bug of ours or the sandbox's, not the solution's: grade() runs the test again
        frame = {"harness": clip(why, 300)}
for i, f in zip(IDS, frame if isinstance(frame, list) else [frame] * len(IDS)):
    emit(dict(f, t=i))
