"""The process-start probe builds and measures on this machine: a start of `true` (the dynamic
loader, libc's start) costs more CPU than one of a program without a C library."""

from __future__ import annotations

import platform
import shutil

import pytest

from bench.process_start import measure

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")


def test_true_costs_more_than_a_program_without_libc() -> None:
    figures = measure(starts=200)
    assert "start_cost_skipped" not in figures, figures
    true, bare = figures["start_cpu_us_true"], figures["start_cpu_us_no_libc"]
    assert isinstance(true, float) and isinstance(bare, float)
    assert 0 < bare < true
    if platform.machine() in ("x86_64", "i686"):
        assert isinstance(figures["cpuid_us"], float) and figures["cpuid_us"] > 0
    else:
        assert "cpuid_us" not in figures


def test_no_compiler_is_said(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "no-such-compiler-hs")
    assert measure(starts=10) == {"start_cost_skipped": "no C compiler"}
