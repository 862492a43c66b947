"""A projector that stopped applying exits even when faust's shutdown hangs."""

from __future__ import annotations

import threading

from services.projector.app import exit_unless_stopped


def test_the_timer_ends_the_process_with_the_code_once_the_grace_is_over() -> None:
    exited: list[int] = []
    fired = threading.Event()

    def exit(code: int) -> None:
        exited.append(code)
        fired.set()

    timer = exit_unless_stopped(0.05, code=3, exit=exit)
    assert timer.daemon  # never holds up a process that exits on its own
    assert fired.wait(timeout=10)
    assert exited == [3]


def test_a_cancelled_timer_never_fires() -> None:
    exited: list[int] = []
    timer = exit_unless_stopped(0.2, exit=exited.append)
    timer.cancel()
    timer.join(timeout=10)
    assert not timer.is_alive()
    assert exited == []
