"""What the write watch costs, and how far a fast writer gets past ``agent_write_mb``.

1. **One look** of the watch: the walk of an overlay's upper layer holding ``--sizes``
   files (what an agent wrote), and the ``statvfs`` of the free-disk floor, against the
   pause the watch takes after it: the share of one core it spends watching one agent.
   Target: <= 2% (the watch looks less often when a look costs more).
2. **The overshoot**: writers as fast as this disk takes them, in a directory on the disk
   the workspaces are on (``--where``), watched with a cap of ``--cap`` MB; the watch kills
   the writers' process group when it sees the cap passed. What is on disk once they are
   dead, past the cap, is what a fast agent can write between two looks. Each writer
   kind is run ``--repeats`` times; the worst is shown.

    .venv/bin/python bench/disk_limits.py [--sizes 10,1000,10000] [--cap 256] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from orchmode.trees.limits import MB, DiskLimits, WriteWatch, free_disk, written_size

#: Writers: a name, and the bash that writes (in its own process group) until killed.
WRITERS = {
    "1 MB files, one at a time (head -c)": (
        "for i in $(seq 1 100000); do head -c 1M /dev/zero > f$i; done"
    ),
    "8 MB files, python, 1 MB writes": (
        'python3 -c "\nimport itertools\nb = bytes(1 << 20)\nfor i in itertools.count():\n'
        "    with open(f'p{i}', 'wb') as f:\n        for _ in range(8): f.write(b)\n\""
    ),
    "4 writers at once (dd, 4 MB files)": (
        "for w in 1 2 3 4; do (for i in $(seq 1 100000); do "
        "dd if=/dev/zero of=d$w-$i bs=1M count=4 status=none; done) & done; wait"
    ),
}


def look_cost(sizes: list[int], repeats: int) -> None:
    print("1. one look of the watch (median of", repeats, "looks)")
    print(f"   {'files written':>14} {'walk':>10} {'statvfs':>10} {'pause':>8} {'share':>7}")
    with tempfile.TemporaryDirectory(dir=os.getcwd()) as scratch:
        for files in sizes:
            upper = Path(scratch) / f"upper-{files}"
            for i in range(files):
                directory = upper / f"d{i % 50}"
                directory.mkdir(parents=True, exist_ok=True)
                (directory / f"f{i}.py").write_text("x = 1\n" * 20)
            walks, floors = [], []
            for _ in range(repeats):
                started = time.perf_counter()
                written_size(upper)
                walks.append(time.perf_counter() - started)
                started = time.perf_counter()
                free_disk(upper)
                floors.append(time.perf_counter() - started)
            watch = WriteWatch(DiskLimits(), upper, lambda: 0, lambda _: None)
            watch.cost = statistics.median(walks)
            pause = watch.pause()
            floor = statistics.median(floors)
            share = (watch.cost + floor) / pause
            print(
                f"   {files:>14,} {watch.cost * 1e3:>8.2f} ms {floor * 1e6:>7.1f} µs"
                f" {pause:>6.2f} s {share:>6.2%}"
            )


async def overshoot(where: Path, cap_mb: int, repeats: int) -> None:
    print(f"2. past a cap of {cap_mb} MB, in {where} (worst of {repeats})")
    print(f"   {'writer':<38} {'rate':>10} {'on disk at the end':>20} {'past the cap':>14}")
    limits = DiskLimits(write=cap_mb * MB, floor=0)
    for name, command in WRITERS.items():
        worst = 0
        rates = []
        final_worst = 0
        for _ in range(repeats):
            directory = Path(tempfile.mkdtemp(prefix="orchmode-bench-", dir=where))
            try:
                process = await asyncio.create_subprocess_exec(
                    "bash", "-c", command, cwd=directory, start_new_session=True,
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip

                def stop(_reason: str, pid: int = process.pid) -> None:
                    os.killpg(pid, signal.SIGKILL)

                watch = WriteWatch(limits, directory, lambda d=directory: written_size(d), stop)
                started = time.perf_counter()
                await watch.run()
                await process.wait()
                took = time.perf_counter() - started
                final = written_size(directory)
                rates.append(final / took / MB)
                if final - limits.write > worst:
                    worst, final_worst = final - limits.write, final
            finally:
                shutil.rmtree(directory, ignore_errors=True)
        print(
            f"   {name:<38} {statistics.median(rates):>6.0f} MB/s {final_worst / MB:>17.0f} MB"
            f" {worst / MB:>11.0f} MB"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,1000,10000")
    parser.add_argument("--cap", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--where", type=Path, default=Path.cwd())
    args = parser.parse_args()
    look_cost([int(s) for s in args.sizes.split(",")], max(args.repeats, 5))
    asyncio.run(overshoot(args.where, args.cap, args.repeats))


if __name__ == "__main__":
    main()
