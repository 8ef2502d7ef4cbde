"""`imgbuild`: parse, run one command, map known errors to their exit codes."""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading
import time

from ..errors import ImgbuildError
from .parser import COMMANDS, parser


class Terminated(KeyboardInterrupt):
    """SIGTERM (a CI job cancelled, `docker stop`, `kill`): unwinds like Ctrl-C, so that every
    `with` and `finally` on the way out runs (temporary directories, build locks, containers)."""


# A child started to clean up (`docker rm -f` of a smoke container) carries this in its
# environment and is left to finish (image/daemon.py, run_cli(cleanup=True)).
CLEANUP_MARK = b"IMGBUILD_CLEANUP=1"


def _children() -> list[int]:
    """The processes this one started that still run (uv, the docker client), by their parent
    pid in /proc: worker threads start some, and no one place holds them all. Clean-up
    commands are not among them."""
    me, found = os.getpid(), []
    try:
        pids = [d for d in os.listdir("/proc") if d.isdigit()]
        program = os.readlink("/proc/self/exe")
    except OSError:
        return []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) != me:
                    continue
            # Between fork and exec a child still runs this program with this process's
            # environment: a clean-up command cannot be told yet, so it is left for the next
            # sweep (50 ms on). Killed there, `docker rm -f` left a served container running.
            if os.readlink(f"/proc/{pid}/exe") == program:
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read()
            # Inside exec the new program is named before its environment is copied in: an
            # empty environment is one not written yet, read again at the next sweep.
            if environ and CLEANUP_MARK not in environ.split(b"\0"):
                found.append(int(pid))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _end_children() -> None:
    """End this process's children now and, from a daemon thread, any started while it winds
    down: a worker thread may be between two runs of uv (a conflict is tried several ways), and
    it must not wait on a child that was started after the first sweep."""
    def sweep() -> None:
        while True:
            for pid in _children():
                try:
                    os.kill(pid, signal.SIGTERM)  # the docker client passes it to its container
                except OSError:
                    pass
            time.sleep(0.05)

    threading.Thread(target=sweep, name="end-children", daemon=True).start()


def _terminate(signum: int, _frame) -> None:
    # Once is enough (SIGKILL stays for the impatient). Not SIG_IGN: children inherit an
    # ignored signal through exec, and the sweep's SIGTERM would not end them.
    signal.signal(signal.SIGTERM, lambda *_: None)
    _end_children()
    raise Terminated()


def _interrupt(signum: int, _frame) -> None:
    # Ctrl-C reaches the terminal's whole process group, `kill -INT` only this process: end the
    # children before unwinding, or a worker thread would be waited on while its uv runs.
    _end_children()
    raise KeyboardInterrupt()


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the command line only, not a caller's process
        signal.signal(signal.SIGTERM, _terminate)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not if ignored
            signal.signal(signal.SIGINT, _interrupt)
    argv = list(sys.argv[1:] if argv is None else argv)
    lead = next((i for i, a in enumerate(argv) if not a.startswith("-")), len(argv))
    if "--version" in argv[:lead]:  # `imgbuild --version [--json]` is `imgbuild version`
        argv.remove("--version")
        argv.insert(0, "version")
    if argv and not argv[0].startswith("-") and argv[0] not in COMMANDS:
        argv.insert(0, "build")  # `imgbuild TARGET ...` is `imgbuild build TARGET ...`
    args = parser().parse_args(argv)
    if getattr(args, "insecure_registry", None):
        # Read by every registry call this process makes (image/distribution.py).
        known = os.environ.get("IMGBUILD_INSECURE_REGISTRIES", "")
        os.environ["IMGBUILD_INSECURE_REGISTRIES"] = ",".join(
            [h for h in known.split(",") if h] + args.insecure_registry)
    # The one lazy import: a command loads only the stages it runs.
    command = importlib.import_module(f"{__package__}.commands.{COMMANDS[args.command]}")
    from .console import make_output

    out = make_output(getattr(args, "json", False), getattr(args, "progress", "auto"))
    try:
        return command.run(args, out)
    except ImgbuildError as e:
        out.error(e)
        return e.exit_code
    except KeyboardInterrupt as e:
        out.err.print("terminated" if isinstance(e, Terminated) else "interrupted")
        return 143 if isinstance(e, Terminated) else 130
