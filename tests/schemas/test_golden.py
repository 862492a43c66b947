"""Golden samples: every tag has one, and every one still decodes to the same thing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from schemas import codec
from schemas.events import EVENTS_BY_TAG
from schemas.samples import sample_envelopes

GOLDEN = Path(__file__).parent / "golden"
FILES = sorted(GOLDEN.glob("*.json"))


def test_every_tag_has_a_golden_sample() -> None:
    have = {p.stem for p in FILES}
    assert have == set(EVENTS_BY_TAG), (
        f"missing golden samples: {sorted(set(EVENTS_BY_TAG) - have)}; "
        f"samples of unknown tags: {sorted(have - set(EVENTS_BY_TAG))}"
    )


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_golden_sample_decodes(path: Path) -> None:
    data = path.read_bytes()
    env = codec.decode(data)
    assert env.tag == path.stem
    assert env.event.__struct_config__.tag == path.stem
    # Re-encoding reproduces the sample (field for field), in JSON and through msgpack.
    assert json.loads(codec.encode_json(env)) == json.loads(data)
    assert codec.decode(codec.encode(env, "msgpack")) == env


def test_samples_module_matches_golden_files() -> None:
    """The in-code samples are the golden ones (a changed sample means a changed schema)."""
    for env in sample_envelopes():
        golden = codec.decode((GOLDEN / f"{env.tag}.json").read_bytes())
        assert golden == env, env.tag
