#!/usr/bin/env python3
"""
test_readme.py - every shell example of README.md, run in order as a user
types it, so that the README cannot drift from what the code does.

Each fenced ```sh block is a step. They run one after another in one folder,
a copy of the repository's (its tracked entries, bin/ and build/ linked, so
nothing is rebuilt and nothing the examples write lands in the checkout),
with bash, `set -e -o pipefail`, and the shell variables each block leaves
carried to the next one, as in one terminal. A block passes when every
command in it exits 0; curl is the real curl with --fail-with-body added
(unless the line has -f already), so an HTTP error answer fails its block as
it would catch a reader's eye. Each block has a time limit.

A line `<!-- readme-test: MARK -->` just above a block's fence says how to
run it (a reader of the rendered README does not see it, and still sees the
block):
  with make run   `make run` serves while it runs ("in another terminal"):
                  started here before the first such block, stopped (SIGTERM)
                  before the next block without the mark
  gpu             needs a GPU (--device cuda): run where `nvidia-smi -L` lists
                  one, else a SKIP line naming it
  shared          needs ../shared beside the checkout (the larger reference
                  fixtures): run where it is (linked beside the copy), else a
                  SKIP line naming it
  tensorflow      needs ../shared and python3's tensorflow (clients/convert
                  reading a TensorFlow checkpoint): run where both are, else
                  a SKIP line naming what is missing
  not run: WHY    left out, with a note saying why (make test itself, ...)
Any other mark is a failure. Ports: the README's 127.0.0.1:8080 and
127.0.0.1:8081 become free ports here (`make run PORT=`, and
$SPANSERVE_URL for spanctl's default), and the variables that would point
spanctl or a server elsewhere (SPANSERVE_API_KEY, SPANSERVE_ADMIN_KEY, ...)
are removed. Servers a block starts itself (`... &`) are stopped at the end
with SIGTERM to the block's process group. Sanitizer reports in any output
fail the test.

  python3 tests/test_readme.py             # SPANSERVE_BIN (default bin/spanserve)
  TEST_README_VERBOSE=1 python3 tests/test_readme.py   # every block's output

Ends with "test_readme.py: N passed, N failed": a check per block run, and
one each time the `make run` server is stopped.
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.abspath(os.environ.get("SPANSERVE_BIN", "bin/spanserve"))
README = os.path.join(ROOT, "README.md")
SHARED = os.path.abspath(os.environ.get("SPANSERVE_SHARED", os.path.join(ROOT, "..", "shared")))
BLOCK_SECONDS = int(os.environ.get("TEST_README_BLOCK_SECONDS", "300"))
SLOW_BLOCK = 20   # a block that takes longer is named, with its time
VERBOSE = bool(os.environ.get("TEST_README_VERBOSE"))
SAN = re.compile(r"ERROR: (Address|Undefined|Leak)Sanitizer|runtime error")
MARK = re.compile(r"^<!--\s*readme-test:\s*(.*?)\s*-->\s*$")
# what would point spanctl, curl or a server away from what the README says
UNSET = ("SPANSERVE_API_KEY", "SPANSERVE_ADMIN_KEY", "SPANSERVE_URL", "SPANSERVE_JOBS_URL",
         "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")

PASS = FAIL = 0


def check(label, cond, reason=""):
    global PASS, FAIL
    if cond:
        PASS += 1
    else:
        FAIL += 1
        print(f"FAIL test_readme.py: {label}: {reason}", flush=True)
    return cond


def blocks(path):
    """[(line of the fence, mark or None, text)] of every ```sh block."""
    out, lines = [], open(path, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```sh":
            m = MARK.match(lines[i - 1]) if i > 0 else None
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            out.append((i + 1, m.group(1) if m else None, "\n".join(lines[i + 1:j]) + "\n"))
            i = j
        i += 1
    return out


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def workdir(tmp):
    """A folder that looks like the repository's to the examples: its tracked
    top-level entries, bin/ (the binaries under test) and build/ linked."""
    w = os.path.join(tmp, "repo")
    os.mkdir(w)
    try:
        names = subprocess.run(["git", "-C", ROOT, "ls-files"], capture_output=True, text=True, check=True).stdout
        names = sorted({n.split("/")[0] for n in names.split("\n") if n})
    except (OSError, subprocess.CalledProcessError):
        names = sorted(n for n in os.listdir(ROOT) if not n.startswith(".") and n not in ("bin", "models", "spanserve-state"))
    for n in names:
        if os.path.exists(os.path.join(ROOT, n)):
            os.symlink(os.path.join(ROOT, n), os.path.join(w, n))
    os.symlink(os.path.dirname(BIN), os.path.join(w, "bin"))
    os.symlink(os.path.join(ROOT, "build"), os.path.join(w, "build"))
    return w


def curl_shim(tmp):
    """A directory with a `curl` that fails on HTTP errors, first on PATH."""
    real = shutil.which("curl")
    d = os.path.join(tmp, "shim")
    os.mkdir(d)
    with open(os.path.join(d, "curl"), "w") as f:
        f.write("#!/bin/sh\n"
                "# the README's curl, made to exit 22 on an HTTP error answer (body still printed)\n"
                "for a in \"$@\"; do case $a in --fail|--fail-with-body|-[!-]*f*) exec %s \"$@\" ;; esac; done\n"
                "exec %s --fail-with-body \"$@\"\n" % (real, real))
    os.chmod(os.path.join(d, "curl"), 0o755)
    return d


def has_gpu():
    try:
        p = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
        return p.returncode == 0 and "GPU" in p.stdout
    except (OSError, subprocess.TimeoutExpired):
        return False


def ready(url, seconds):
    end = time.time() + seconds
    while time.time() < end:
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def stop_group(pgid, seconds=60, child=None):
    """SIGTERM to a process group, SIGKILL to what is left after SECONDS;
    True when it ended in time. CHILD, the group's leader when it is ours,
    is reaped on the way (a zombie still belongs to its group)."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    end = time.time() + seconds
    while time.time() < end:
        if child is not None:
            child.poll()
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return False


def stop_make_run(server, log):
    """SIGTERM to make and its server, as Ctrl-C would: the server drains
    and exits (a check)."""
    check("make run stops on SIGTERM", stop_group(server.pid, child=server), f"still running after 60 s: {tail(log)}")
    server.wait()


def tail(path, n=15):
    """The last N lines of a log, indented, each cut to 300 characters."""
    try:
        return "\n".join("    " + ln[:300] for ln in open(path, errors="replace").read().rstrip("\n").split("\n")[-n:])
    except OSError:
        return ""


def main():
    tmp = tempfile.mkdtemp(prefix="test_readme.")
    work = workdir(tmp)
    port, jport = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k not in UNSET}
    env["PATH"] = curl_shim(tmp) + os.pathsep + env.get("PATH", "")
    env["SPANSERVE_URL"] = f"http://127.0.0.1:{port}"   # spanctl's default, 127.0.0.1:8080 in the README
    state = os.path.join(tmp, "vars.sh")
    open(state, "w").close()
    fresh = set(subprocess.run(["bash", "-c", "compgen -v"], env=env, capture_output=True, text=True).stdout.split())
    with open(os.path.join(tmp, "fresh-vars"), "w") as f:
        f.write("\n".join(sorted(fresh)) + "\n")
    # make run as the README says, with this build's binaries: when they are
    # not bin/ (make asan's, in build/asan/bin/), BUILD= names their tree and
    # -o keeps make from remaking them with the flags of a plain build
    make_args = ["make", "run", f"PORT={port}"]
    if os.path.dirname(BIN) != os.path.join(ROOT, "bin"):
        build = os.path.relpath(os.path.dirname(os.path.dirname(BIN)), ROOT)
        make_args += [f"BUILD={build}", "-o", f"{build}/bin/spanserve", "-o", f"{build}/bin/spanctl"]
    server = None
    groups = []
    gpu = None
    logs = []
    try:
        for n, (line, mark, text) in enumerate(blocks(README)):
            where = f"README line {line}"
            if mark is not None and mark.startswith("not run:"):
                print(f"note: {where} not run: {mark[len('not run:'):].strip()}")
                continue
            if mark == "tensorflow" and subprocess.run([sys.executable, "-c", "import tensorflow"],
                                                       capture_output=True).returncode != 0:
                print(f"SKIP test_readme.py: {where}: needs tensorflow (pip install tensorflow-cpu==2.15.1)")
                continue
            if mark in ("shared", "tensorflow"):
                if not os.path.isdir(os.path.join(SHARED, "fixtures")):
                    print(f"SKIP test_readme.py: {where}: needs ../shared (the larger reference fixtures)")
                    continue
                if not os.path.exists(os.path.join(tmp, "shared")):
                    os.symlink(SHARED, os.path.join(tmp, "shared"))
            if mark not in (None, "with make run", "gpu", "shared", "tensorflow"):
                check(where, False, f"unknown mark <!-- readme-test: {mark} -->")
                continue
            if mark == "gpu":
                gpu = has_gpu() if gpu is None else gpu
                if not gpu:
                    print(f"SKIP test_readme.py: {where}: needs a GPU (--device cuda)")
                    continue
            if mark == "with make run" and server is None:
                log = os.path.join(tmp, "make-run.log")
                logs.append(log)
                server = subprocess.Popen(make_args, cwd=work, env=env, stdin=subprocess.DEVNULL,
                                          stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
                if not check("make run", ready(f"http://127.0.0.1:{port}", 180),
                             f"{' '.join(make_args)} did not become ready: {tail(log)}"):
                    continue
            if mark != "with make run" and server is not None:
                stop_make_run(server, logs[0])
                server = None
            text = text.replace("127.0.0.1:8080", f"127.0.0.1:{port}").replace("127.0.0.1:8081", f"127.0.0.1:{jport}")
            script, trace = os.path.join(tmp, f"block{n}.sh"), os.path.join(tmp, f"block{n}.trace")
            head = ["set -e -o pipefail",
                    f". '{state}'",
                    # the variables this block leaves, for the next one
                    "readme_vars() {",
                    f"    readme_n=$(compgen -v | grep -vxF -f '{tmp}/fresh-vars' | grep -v '^BASH\\|^_$\\|^readme_n$')",
                    f"    if [ -n \"$readme_n\" ]; then declare -p $readme_n; fi >'{state}.new' 2>/dev/null",
                    "}",
                    "trap 'set +x; readme_vars' EXIT",
                    # each command as it runs, with its README line, for the report
                    f"exec 9>'{trace}'; BASH_XTRACEFD=9; PS4='+ $((LINENO + {line - 9})): '; set -x"]
            with open(script, "w") as f:
                f.write("\n".join(head) + "\n" + text)
            log = os.path.join(tmp, f"block{n}.log")
            logs.append(log)
            t0 = time.time()
            p = subprocess.Popen(["bash", script], cwd=work, env=env, stdin=subprocess.DEVNULL,
                                 stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
            groups.append(p.pid)
            try:
                rc = p.wait(BLOCK_SECONDS)
            except subprocess.TimeoutExpired:
                stop_group(p.pid, 10)
                rc = f"timeout ({BLOCK_SECONDS} s)"
                p.wait()
            if os.path.exists(state + ".new"):
                os.replace(state + ".new", state)
            took = time.time() - t0
            if took > SLOW_BLOCK:   # where the test's time goes (make test and CI must stay quick)
                print(f"note: {where} took {took:.0f} s")
            if VERBOSE:
                print(f"--- {where} ({took:.1f} s, exit {rc})\n{open(log, errors='replace').read()}")
            if rc != 0:
                cmds = [ln for ln in open(trace, errors="replace").read().split("\n") if ln and ln != "+ set +x"
                        and not ln.endswith(": set +x")]
                last = cmds[-1][2:] if cmds else "?"
                check(where, False, f"exit {rc} after {time.time() - t0:.0f} s, in README line {last[:300]}\n"
                                    f"{tail(log)}")
            else:
                check(where, True)
    finally:
        if server is not None:
            stop_make_run(server, logs[0])
        for g in groups:
            stop_group(g)
        for log in logs:
            bad = [ln for ln in open(log, errors="replace") if SAN.search(ln)]
            if bad:
                check(f"sanitizers ({os.path.basename(log)})", False, "".join(bad[:5]))
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"test_readme.py: {PASS} passed, {FAIL} failed")
    return 1 if FAIL else 0


if __name__ == "__main__":
    sys.exit(main())
