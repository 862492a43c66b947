"""Projector: faust-streaming agents that fold events into MySQL projections (issue 3)."""
