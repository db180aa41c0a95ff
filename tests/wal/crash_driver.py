"""Drives tests/wal/crash_child.py: SIGKILL rounds against one WAL directory, then verifies.

Shared by the test suite (a few hundred kills) and bench/soak_wal.py (thousands).
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from tests.wal.helpers import check_payload
from wal import WriteAheadLog

_CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "crash_child.py")
_LINE_TIMEOUT_S = 30.0


@dataclass
class Round:
    round_id: int
    open_next: int | None = None
    durable_max: int = -1


@dataclass
class CrashRun:
    root: str
    rounds: list = field(default_factory=list)
    kills: int = 0

    def durable_max(self) -> int:
        return max((r.durable_max for r in self.rounds), default=-1)


class Zygote:
    def __init__(self) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])))
        self._proc = subprocess.Popen([sys.executable, _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      env=env, bufsize=0)
        # Reports the forked writer made before the fork server's PID line reached the
        # pipe (the two processes race for it); consumed before reading the pipe again.
        self._early: list[str] = []
        assert self._line() == "READY"

    def _line(self) -> str:
        if self._early:
            return self._early.pop(0)
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError("crash child exited unexpectedly")
        return line.decode().strip()

    def run_round(self, run: CrashRun, rng: random.Random) -> None:
        """One fork, one SIGKILL at a random moment, and the checks the reports allow."""
        current = Round(len(run.rounds) + 1)
        before = run.durable_max()
        self._proc.stdin.write(f"RUN {run.root} {current.round_id} {rng.randrange(1 << 30)}\n".encode())
        pid = self._await_pid()
        if rng.random() < 0.15:  # sometimes kill during start-up and recovery
            time.sleep(rng.random() * 0.01)
        else:
            current.open_next = self._expect_open(current, before)
            time.sleep(rng.random() * 0.03)
        os.kill(int(pid), signal.SIGKILL)
        run.kills += 1
        self._drain(current, before, pid)
        run.rounds.append(current)

    def _await_pid(self) -> str:
        """The writer's pid; OPEN/D lines that overtook it are kept for later, in order."""
        early = []
        for _ in range(1000):  # bounded: a writer reports at most OPEN + a few D first
            parts = self._line().split()
            if parts[0] == "PID":
                self._early = early + self._early
                return parts[1]
            assert parts[0] in ("OPEN", "D"), parts
            early.append(" ".join(parts))
        raise AssertionError("fork server never reported the writer's pid")

    def _expect_open(self, current: Round, before: int) -> int:
        line = self._line()
        kind, _first, next_offset = line.split()
        assert kind == "OPEN", line
        assert int(next_offset) >= before + 1, f"offsets {next_offset}..{before} reported durable were lost"
        return int(next_offset)

    def _drain(self, current: Round, before: int, pid: str) -> None:
        deadline = time.monotonic() + _LINE_TIMEOUT_S
        while time.monotonic() < deadline:
            parts = self._line().split()
            if parts[0] == "EXIT":
                assert parts[1] == pid
                return
            if parts[0] == "OPEN":
                current.open_next = int(parts[2])
                assert current.open_next >= before + 1, "offsets reported durable were lost"
            elif parts[0] == "D":
                offset = int(parts[1])
                assert offset > current.durable_max, "durable reports must move forward"
                assert current.open_next is not None and offset >= current.open_next
                current.durable_max = offset
        raise AssertionError("crash child did not report the writer's exit")

    def close(self) -> None:
        self._proc.stdin.close()
        self._proc.wait(10)


def verify(run: CrashRun) -> int:
    """Every reported-durable message is present and intact; no gap, no reused offset."""
    from wal.config import WalConfig
    log = WriteAheadLog.open(run.root, "/crash/topic", WalConfig())
    try:
        owners = sorted((r.open_next, r.round_id) for r in run.rounds if r.open_next is not None)
        assert log.next_offset >= run.durable_max() + 1
        with log.reader(log.first_offset, live=False) as reader:
            expected = log.first_offset
            for record in reader:
                offset, round_id = check_payload(record.payload)
                assert offset == record.offset == expected, "gap or reorder"
                assert round_id == _owner(owners, offset), f"offset {offset} was written twice (reused)"
                expected += 1
        assert expected == log.next_offset
        return expected
    finally:
        log.close()


def _owner(owners: list, offset: int) -> int:
    """The round that wrote ``offset``: the last one that opened at or below it."""
    owner = None
    for open_next, round_id in owners:
        if open_next <= offset:
            owner = round_id
        else:
            break
    assert owner is not None, f"offset {offset} precedes every round"
    return owner
