"""Run a script as several JAX processes: on this machine to try a multi-host program before a
cluster, or as one process of a cluster.

    python -m tempo_lab.launch -n 2 script.py [args ...]          # 2 local processes
    python -m tempo_lab.launch --coordinator HOST:PORT --processes 4 --process-id K script.py

Each process calls ``jax.distributed.initialize`` with the coordinator, the number of
processes and its own id, then runs ``script.py`` as ``__main__`` (``sys.argv`` as given). The
script is an ordinary JAX program: it builds its mesh from ``jax.devices()`` (every process's
devices) and compiles the same program in every process; ``jax.process_index()`` says which
process it is.

Locally (``-n``) the processes join over loopback on a free port; on the CPU each gets
``--devices`` forced host devices and gloo collectives, as JAX's multi-controller runtime needs
there. Their output comes back line by line prefixed with ``[k]``. When one process fails, or
``--timeout`` passes, the others are stopped (a collective would wait for the lost process
forever); the exit status is the first failure's.
"""
from __future__ import annotations

import argparse
import os
import runpy
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback

ENV = "TEMPO_LAB_LAUNCH"  # "coordinator,processes,process_id,launcher pid": for the children


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def initialize(coordinator: str, processes: int, process_id: int, cpu: bool) -> None:
    """Join the group; on the CPU with gloo collectives (JAX's default CPU client has none
    across processes)."""
    import jax

    if cpu:
        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=processes,
                               process_id=process_id)


def run_script(script: str, argv: list[str]) -> None:
    sys.argv = [script, *argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")


def _die_with(launcher: int) -> None:
    """On Linux, this process is killed when the launcher dies, however it dies: a launcher
    killed by a signal runs no cleanup, and a process left alone would wait in a collective
    for the others forever."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    if os.getppid() != launcher:  # it died before this process asked
        _leave(1)


def _run_or_leave(script: str, argv: list[str]) -> None:
    """``run_script``; a failure leaves at once with its status: a normal exit would wait for
    the other processes at JAX's shutdown barrier (minutes) before the launcher saw it."""
    try:
        run_script(script, argv)
    except SystemExit as e:
        if e.code in (None, 0):
            raise
        if not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
        _leave(e.code if isinstance(e.code, int) else 1)
    except BaseException:  # noqa: BLE001 - the user's error, shown as Python shows it
        traceback.print_exc()
        _leave(1)


def _leave(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _pump(k: int, stream, out) -> None:
    for line in iter(stream.readline, b""):
        out.buffer.write(f"[{k}] ".encode() + line)
        out.flush()


def spawn(n: int, script: str, argv: list[str], devices: int, timeout: float | None) -> int:
    """Start ``n`` local CPU processes of ``script``; wait for them all; their exit status."""
    port = free_port()
    procs, pumps = [], []
    for k in range(n):
        env = dict(os.environ)
        env[ENV] = f"127.0.0.1:{port},{n},{k},{os.getpid()}"
        flags = [f for f in env.get("XLA_FLAGS", "").split()
                 if not f.startswith("--xla_force_host_platform_device_count")]
        env["XLA_FLAGS"] = " ".join([*flags, f"--xla_force_host_platform_device_count={devices}"])
        p = subprocess.Popen([sys.executable, "-m", "tempo_lab.launch", "--child", script, *argv],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True)
        procs.append(p)
        pumps.append(threading.Thread(target=_pump, args=(k, p.stdout, sys.stdout), daemon=True))
        pumps[-1].start()
    deadline = None if timeout is None else time.monotonic() + timeout
    status = 0
    try:
        while None in [p.poll() for p in procs]:  # every one polled, each time
            failed = [p.returncode for p in procs if p.returncode not in (None, 0)]
            if failed or (deadline is not None and time.monotonic() > deadline):
                status = failed[0] if failed else 124
                if not failed:
                    print(f"tempo_lab.launch: stopped after --timeout {timeout:g} s",
                          file=sys.stderr)
                break
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        for p in procs:
            p.wait()
        for t in pumps:
            t.join(timeout=5)
    return status or next((p.returncode for p in procs if p.returncode), 0)


def main(args: list[str] | None = None) -> int:
    prog = sys.argv[0] if sys.argv[0].startswith("tempo-lab") else "python -m tempo_lab.launch"
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--local", type=int, metavar="N",
                    help="start N processes on this machine")
    ap.add_argument("--devices", type=int, default=2,
                    help="CPU devices per local process (default 2)")
    ap.add_argument("--timeout", type=float, default=None,
                    help="stop every local process after this many seconds")
    ap.add_argument("--coordinator", help="HOST:PORT of process 0 (one process of a cluster)")
    ap.add_argument("--processes", type=int, help="how many processes the cluster runs")
    ap.add_argument("--process-id", type=int, help="this process's id, 0 to processes - 1")
    ap.add_argument("--cpu", action="store_true", help="a cluster of CPU hosts (gloo)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("script")
    ap.add_argument("argv", nargs=argparse.REMAINDER)
    a = ap.parse_args(args)
    if a.child:
        coordinator, n, k, launcher = os.environ[ENV].split(",")
        _die_with(int(launcher))
        initialize(coordinator, int(n), int(k), cpu=True)
        _run_or_leave(a.script, a.argv)
        return 0
    if a.local is not None:
        if a.local < 1 or a.devices < 1:
            ap.error("-n and --devices take a positive number")
        return spawn(a.local, a.script, a.argv, a.devices, a.timeout)
    if a.coordinator is None or a.processes is None or a.process_id is None:
        ap.error("give -n N (local processes), or --coordinator, --processes and --process-id "
                 "(one process of a cluster)")
    if not 0 <= a.process_id < a.processes:
        ap.error(f"--process-id {a.process_id}: give 0 to {a.processes - 1}")
    initialize(a.coordinator, a.processes, a.process_id, a.cpu)
    run_script(a.script, a.argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
