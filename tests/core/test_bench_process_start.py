"""The process-start probe's output is read into its figures, or refused."""

from __future__ import annotations

import pytest

from bench.process_start import parse


def test_both_programs_and_the_cpuid_cost_are_read() -> None:
    out = parse("/usr/bin/true 720.80 23.19\n/tmp/x/exit0 33.20 13.72\ncpuid 7.713\n")
    assert out == {"start_cpu_us_true": 720.8, "start_cpu_us_no_libc": 33.2, "cpuid_us": 7.713}


def test_no_cpuid_figure_off_x86() -> None:
    out = parse("/usr/bin/true 500.0 20.0\n/tmp/x/exit0 30.0 10.0\ncpuid -\n")
    assert out == {"start_cpu_us_true": 500.0, "start_cpu_us_no_libc": 30.0}


@pytest.mark.parametrize("output", ["", "cpuid 7.0\n", "/usr/bin/true 720.8 23.1\ncpuid 7.0\n",
                                    "/usr/bin/true 720.8\n/tmp/exit0 33.2\n"])
def test_output_missing_a_program_is_refused(output: str) -> None:
    with pytest.raises(ValueError, match="expected two programs"):
        parse(output)
