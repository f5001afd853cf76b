"""The whole machine's CPU, from /proc/stat."""

from __future__ import annotations

import os
from pathlib import Path


def machine_cpu() -> float:
    """CPU seconds the whole machine has been busy (every process and the kernel's own
    threads): the only count that sees a sandboxed shell's processes, which die in their
    PID namespace unreaped by us, and the kernel's work of tearing namespaces and mounts
    down, done in its worker threads."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
