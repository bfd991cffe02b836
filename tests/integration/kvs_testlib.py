"""kvs_testlib.py -- what the python integration tests share: a kvstashd of their own.

Imported by health_grpcio.py, data_grpcio.py and metrics_test.py, which run as
scripts, so this directory is on sys.path; only the standard library is used here (expect_code imports grpc when called).

    with Kvstashd(path, metrics=True) as srv:   # starts it, waits for its port files
        srv.port, srv.mport, srv.tmp            # gRPC port, metrics port, scratch dir
        rc = srv.stop(timeout_s=5)              # SIGTERM, then its exit status

Invariants: on leaving the with block the server is not running (killed if stop()
was not called or did not end it) and srv.tmp is removed. Every failure goes through
fail(): a "FAIL: ..." line on stderr and exit status 1, never a traceback for an
expected failure (no such program, the server dying at start, no port file,
no exit after SIGTERM).
"""
import ipaddress
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time


def descendants(pid):
    """pid and every process below it (kvstashd's data plane runs in a child)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for tid in os.listdir("/proc/%d/task" % p):
                with open("/proc/%d/task/%s/children" % (p, tid)) as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            continue
    return out


def listening(pid):
    """(address, port) of every TCP socket pid, or a process below it, listens on."""
    inodes = set()
    for p in descendants(pid):
        try:
            fds = os.listdir("/proc/%d/fd" % p)
        except OSError:
            continue
        for fd in fds:
            try:
                t = os.readlink("/proc/%d/fd/%s" % (p, fd))
            except OSError:
                continue
            if t.startswith("socket:["):
                inodes.add(t[8:-1])
    out = []
    for name, v6 in (("tcp", False), ("tcp6", True)):
        try:
            lines = open("/proc/%d/net/%s" % (pid, name)).read().splitlines()[1:]
        except OSError:
            continue
        for ln in lines:
            f = ln.split()
            if f[3] != "0A" or f[9] not in inodes:  # 0A: LISTEN
                continue
            hexaddr, hexport = f[1].split(":")
            raw = bytes.fromhex(hexaddr)
            if v6:  # four little-endian 32-bit words
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
                addr = ipaddress.IPv6Address(raw)
                if addr.ipv4_mapped is not None:
                    addr = addr.ipv4_mapped
            else:
                addr = ipaddress.IPv4Address(raw[::-1])
            out.append((addr, int(hexport, 16)))
    return out


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def expect_code(fn, code, what, field=None):
    """Calls fn(), which must fail with grpc status CODE (and a message naming FIELD)."""
    import grpc  # only the grpcio tests call this; the module itself stays stdlib-only

    try:
        fn()
    except grpc.RpcError as e:
        if e.code() != code:
            fail("%s: %s (%s), want %s" % (what, e.code(), e.details(), code))
        if field and field not in (e.details() or ""):
            fail("%s: message %r does not name %r" % (what, e.details(), field))
        print("ok - %s -> %s: %s" % (what, e.code().name, e.details()))
        return
    fail("%s succeeded, want %s" % (what, code))


def wait_file(proc, path, timeout_s=10.0):
    """The integer in PATH once kvstashd (PROC) has written it whole (newline-ended)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            fail("kvstashd exited with %d before writing %s" % (proc.returncode, path))
        try:
            with open(path) as f:
                text = f.read()
            if text.endswith("\n"):
                return int(text)
        except FileNotFoundError:
            pass
        time.sleep(0.01)
    fail("kvstashd wrote no %s within %.0f s" % (path, timeout_s))


class Kvstashd:
    """kvstashd on 127.0.0.1 port 0 (and the metrics listener on port 0 if METRICS),
    --log-level warn, EXTRA arguments appended; ports read back from its port files."""

    def __init__(self, kvstashd, extra=(), metrics=False, prefix="kvs-py-"):
        self.cmd = [kvstashd, "--listen", "127.0.0.1:0"]
        self.extra = list(extra)
        self.metrics = metrics
        self.prefix = prefix
        self.proc = None
        self.tmp = None
        self.port = None
        self.mport = None

    def __enter__(self):
        self.tmp = tempfile.mkdtemp(prefix=self.prefix)
        port_file = os.path.join(self.tmp, "port")
        mport_file = os.path.join(self.tmp, "mport")
        cmd = self.cmd + ["--port-file", port_file]
        if self.metrics:
            cmd += ["--metrics-listen", "127.0.0.1:0", "--metrics-port-file", mport_file]
        cmd += ["--log-level", "warn"] + self.extra
        try:
            try:
                self.proc = subprocess.Popen(cmd)
            except OSError as e:
                fail("cannot run %s: %s" % (cmd[0], e.strerror))
            self.port = wait_file(self.proc, port_file)
            if self.metrics:
                self.mport = wait_file(self.proc, mport_file)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def stop(self, timeout_s=5.0):
        """SIGTERM; its exit status, or fail() if it is still running after TIMEOUT_S."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            fail("kvstashd still running %g s after SIGTERM" % timeout_s)

    def __exit__(self, *exc):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
        return False
