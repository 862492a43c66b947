"""Runs under .venv-hail: submit one batch of N no-op jobs with the official client.

Usage: hail_submit.py URL TOKEN BILLING_PROJECT N [CPU]  ->  prints {"id", "seconds", "cpu_seconds",
"started_at"} as JSON (CPU: the client's own, during the submission; ``started_at``: the wall
clock, in seconds since the epoch, when ``submit()`` was called, after the interpreter started,
imported hailtop and built the batch's N job objects in memory).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from hailtop.aiocloud.common import Session
from hailtop.batch_client import aioclient


async def main() -> None:
    url, token, project, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    resources = {"cpu": sys.argv[5]} if len(sys.argv) > 5 else None
    session = Session(credentials=aioclient.HailExplicitTokenCredentials(token))
    client = aioclient.BatchClient(project, url=url, session=session, headers={})
    try:
        b = client.create_batch(attributes={"bench": str(n)})
        for i in range(n):
            b.create_job("ubuntu:24.04", ["true"], attributes={"name": f"j{i}"},
                         resources=resources)
        started_at = time.time()
        t0, c0 = time.perf_counter(), time.process_time()
        await b.submit(disable_progress_bar=True)
        print(json.dumps({"id": b.id, "seconds": time.perf_counter() - t0,
                          "cpu_seconds": time.process_time() - c0, "started_at": started_at}))
    finally:
        await client.close()


if __name__ == "__main__":
    asyncio.run(main())
