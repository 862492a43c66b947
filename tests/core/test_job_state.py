from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.job_state import (
    ALL_STATES,
    COMPLETED,
    TRANSITIONS,
    IllegalTransition,
    can_transition,
    initial_state,
    is_complete,
    transition,
)


def test_every_state_has_a_row() -> None:
    assert set(TRANSITIONS) == set(ALL_STATES)


def test_completed_states_are_final() -> None:
    for state in COMPLETED:
        assert TRANSITIONS[state] == frozenset()
        assert is_complete(state)


@pytest.mark.parametrize(
    ("source", "target", "legal"),
    [("Pending", "Ready", True), ("Pending", "Running", False), ("Ready", "Running", True),
     ("Running", "Success", True), ("Success", "Failed", False), ("Running", "Ready", True),
     ("Cancelled", "Ready", False), ("Ready", "Success", False)],
    ids=lambda v: str(v),
)
def test_transitions(source: str, target: str, legal: bool) -> None:
    assert can_transition(source, target) is legal  # type: ignore[arg-type]
    if not legal:
        with pytest.raises(IllegalTransition, match=f"from {source} to {target}"):
            transition(source, target)  # type: ignore[arg-type]


def test_initial_state() -> None:
    assert initial_state(0) == "Ready"
    assert initial_state(3) == "Pending"
    with pytest.raises(ValueError, match="negative"):
        initial_state(-1)


@given(st.lists(st.sampled_from(ALL_STATES), max_size=30), st.integers(0, 2))
def test_random_walks_follow_only_legal_edges(proposals: list[str], parents: int) -> None:
    """Apply random proposed moves, keeping the legal ones: the walk never leaves the machine,
    never leaves a final state, and always starts in Ready or Pending."""
    state = initial_state(parents)
    assert state in ("Ready", "Pending")
    for target in proposals:
        if can_transition(state, target):  # type: ignore[arg-type]
            state = transition(state, target)  # type: ignore[arg-type]
        elif is_complete(state):
            with pytest.raises(IllegalTransition):
                transition(state, target)  # type: ignore[arg-type]
    assert state in ALL_STATES


def test_every_non_final_state_can_reach_a_final_state() -> None:
    for start in ALL_STATES:
        seen, frontier = {start}, [start]
        while frontier:
            for nxt in TRANSITIONS[frontier.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    frontier.append(nxt)
        assert seen & COMPLETED, start
