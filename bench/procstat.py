"""CPU seconds and resident memory of a process tree, from ``/proc`` (Linux)."""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = [
    "TreeSample",
    "ancestors",
    "core_busy_seconds",
    "cpu_seconds",
    "cpu_split",
    "others_like",
    "reset_peak",
    "rss",
    "tree",
]

_TICK = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # comm may hold spaces and parentheses: the fields start after the last ")".
    return raw[raw.rfind(b")") + 2 :].decode().split()


def tree(root: int) -> list[int]:
    """``root`` and all its descendants that are alive now."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = _stat_fields(int(name))
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime (and those of their reaped children) summed over ``pids``, in seconds."""
    user, system = cpu_split(pids)
    return user + system


def cpu_split(pids: list[int]) -> tuple[float, float]:
    """(user, system) seconds summed over ``pids``, reaped children's included."""
    user = system = 0
    for pid in pids:
        fields = _stat_fields(pid)
        if fields is not None:  # fields[11:15] = utime stime cutime cstime (stat fields 14-17)
            user += int(fields[11]) + int(fields[13])
            system += int(fields[12]) + int(fields[14])
    return user / _TICK, system / _TICK


def core_busy_seconds() -> dict[int, float]:
    """Time per core since boot that processes ran, all of them (user+nice+system of /proc/stat).

    Interrupt and softirq time is left out: loopback traffic of the benchmark itself lands there."""
    out: dict[int, float] = {}
    with open("/proc/stat", "rb") as f:
        for line in f:
            if line.startswith(b"cpu") and line[3:4].isdigit():
                name, user, nice, system = line.split()[:4]
                out[int(name[3:])] = (int(user) + int(nice) + int(system)) / _TICK
    return out


def ancestors(pid: int) -> set[int]:
    """``pid`` and its parents up to init."""
    out = set()
    while pid > 1 and pid not in out:
        out.add(pid)
        fields = _stat_fields(pid)
        if fields is None:
            break
        pid = int(fields[1])
    return out


def others_like(patterns: tuple[str, ...], mine: set[int]) -> list[str]:
    """Command lines of processes outside ``mine`` that contain one of ``patterns`` (a concurrent run)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in mine:
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if any(p in cmd for p in patterns):
            found.append(f"{name}: {cmd[:160]}")
    return found


@dataclass(frozen=True, slots=True)
class TreeSample:
    rss_kb: int  # VmRSS summed over the tree
    hwm_kb: int  # VmHWM summed over the tree (each process's own peak since start or reset_peak)


def rss(pids: list[int]) -> TreeSample:
    rss_kb = hwm_kb = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"VmRSS:"):
                        rss_kb += int(line.split()[1])
                    elif line.startswith(b"VmHWM:"):
                        hwm_kb += int(line.split()[1])
        except OSError:
            continue
    return TreeSample(rss_kb, hwm_kb)


def reset_peak(pids: list[int]) -> bool:
    """Reset VmHWM to the current RSS (``clear_refs`` 5, Linux ≥ 4.0, needs the right to write it)."""
    ok = True
    for pid in pids:
        try:
            with open(f"/proc/{pid}/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            ok = False
    return ok
