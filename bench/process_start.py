"""What a process start costs this machine, apart from anything of ours.

Every no-op job is one start of ``true``, and on this project's VMs that start is most of a
job's CPU (docs/performance.md, "Where the time goes"). The bench prints it beside the end to end
figure, split in two, so a run says how much of a job's CPU the machine charges whatever runs
the job:

- ``start_cpu_us_true``: CPU per start of ``true`` (the exec, the program's own start in the
  dynamic loader and libc, its exit), started one after another the way the worker's spawner
  starts jobs (``vfork``, ``execve``, ``waitpid``);
- ``start_cpu_us_no_libc``: the same for a program without a C library that exits at once
  (``bench/probes/exit0.c``): the kernel's part alone;
- ``cpuid_us``: one ``cpuid`` instruction (x86 only). glibc runs it in every process's start to
  learn the CPU and its caches (68 times in a start of ``true`` on an Intel host with Debian's
  glibc 2.36, counted by single-stepping), and under a hypervisor each one leaves the guest.

The probes are C (``bench/probes/``), built with the C compiler the worker's spawner is built
with; where there is none the figures are left out and the run says so.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

PROBES = Path(__file__).with_name("probes")
STARTS = 2_000
"""Starts of each program: about 1.5 s of ``true`` on the slowest host seen."""


def _build(cc: str, out: Path) -> tuple[Path, Path]:
    start_cost, exit0 = out / "start_cost", out / "exit0"
    subprocess.run([cc, "-O2", "-o", str(start_cost), str(PROBES / "start_cost.c")],
                   check=True, capture_output=True)
    subprocess.run([cc, "-nostdlib", "-static", "-o", str(exit0), str(PROBES / "exit0.c")],
                   check=True, capture_output=True)
    return start_cost, exit0


def parse(output: str) -> dict[str, float]:
    """The figures of ``start_cost``'s output: a line ``PATH CHILDREN_US PARENT_US`` per
    program (``true`` first, then the program without libc) and ``cpuid US`` (or ``-``)."""
    lines = [line.split() for line in output.splitlines() if line.strip()]
    programs = [fields for fields in lines if fields[0] != "cpuid"]
    if len(programs) != 2 or any(len(fields) != 3 for fields in programs):
        raise ValueError(f"start_cost printed {output!r}: expected two programs' lines")
    out = {"start_cpu_us_true": float(programs[0][1]),
           "start_cpu_us_no_libc": float(programs[1][1])}
    cpuid = [fields[1] for fields in lines if fields[0] == "cpuid"]
    if cpuid and cpuid[0] != "-":
        out["cpuid_us"] = float(cpuid[0])
    return out


def measure(starts: int = STARTS) -> dict[str, float | str]:
    """The figures above, or ``{"start_cost_skipped": why}`` where they cannot be had."""
    cc = shutil.which(os.environ.get("CC", "cc"))
    true = shutil.which("true")
    if cc is None or true is None:
        return {"start_cost_skipped": "no C compiler" if cc is None else "no `true` on PATH"}
    with tempfile.TemporaryDirectory(prefix="hs-bench-start-") as tmp:
        try:
            start_cost, exit0 = _build(cc, Path(tmp))
        except subprocess.CalledProcessError as e:
            return {"start_cost_skipped": f"the probes did not build: {e.stderr.decode()[:200]}"}
        done = subprocess.run([str(start_cost), str(starts), true, str(exit0)], check=True,
                              capture_output=True, text=True)
    return {key: round(value, 1 if key != "cpuid_us" else 2)
            for key, value in parse(done.stdout).items()}


if __name__ == "__main__":
    print(measure())
