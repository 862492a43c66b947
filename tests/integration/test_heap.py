"""A service's buffers of hundreds of KB, allocated and freed over and over, reuse pages.

Each case runs in a process of its own: the thresholds are process-wide and cannot be undone.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_CHURN = """
import resource, sys
from services.common.gcpause import tune_for_service
from services.common.heap import keep_big_buffers
if sys.argv[1] == "service":
    tune_for_service()  # what every service calls at start
kept = keep_big_buffers() if sys.argv[1] == "keep" else None
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
before = faults()
for _ in range(200):  # a bunch's shape: its body, its event, a batch that copies both
    body = bytearray(300_000)
    event = bytes(700_000)
    batch = bytearray(event) + body
    del body, event, batch
print(kept, faults() - before)
"""


def _churn(mode: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", _CHURN, mode], check=True, capture_output=True,
                         text=True, cwd=REPO).stdout.split()
    return out[0], int(out[1])


def test_big_buffers_reuse_pages_once_kept() -> None:
    kept, faults_kept = _churn("keep")
    _, faults_default = _churn("default")
    assert kept == "True"
    # By default each round touches fresh pages: some 400 of them (1.7 MB), 80,000 in all.
    assert faults_default > 20_000
    assert faults_kept < faults_default / 20


def test_every_service_keeps_them() -> None:
    _, faults_service = _churn("service")
    _, faults_default = _churn("default")
    assert faults_service < faults_default / 20

