"""JSON and msgpack codecs for envelopes.

Msgpack is the wire format (smaller, faster); JSON is for golden samples, audits and humans.
``decode`` accepts either: a JSON envelope starts with ``{`` (0x7b) while a msgpack envelope
starts with a map header (0x80-0x8f or 0xde/0xdf), so the first byte tells them apart.
Decimals (money, rates) are encoded as strings, so they stay exact in both formats.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import msgspec

from schemas.envelope import BulkEnvelope, Envelope, HeadsEnvelope
from schemas.events import CURRENT_VERSIONS
from schemas.upcast import UPCASTERS, Upcaster, upcast

Format = Literal["msgpack", "json"]

_json_encoder = msgspec.json.Encoder(decimal_format="string")
_msgpack_encoder = msgspec.msgpack.Encoder(decimal_format="string")
_json_decoder = msgspec.json.Decoder(Envelope)
_msgpack_decoder = msgspec.msgpack.Decoder(Envelope)
_json_heads = msgspec.json.Decoder(HeadsEnvelope)
_msgpack_heads = msgspec.msgpack.Decoder(HeadsEnvelope)
_msgpack_bulk = msgspec.msgpack.Decoder(BulkEnvelope)
_json_any = msgspec.json.Decoder()
_msgpack_any = msgspec.msgpack.Decoder()


class DecodeError(ValueError):
    """Bytes that are not a valid envelope of a known event."""


def encode(envelope: Envelope, fmt: Format = "msgpack") -> bytes:
    """Encode an envelope as msgpack (the default) or JSON."""
    if fmt == "msgpack":
        return _msgpack_encoder.encode(envelope)
    return _json_encoder.encode(envelope)


def encode_json(envelope: Envelope) -> bytes:
    """Encode an envelope as JSON."""
    return _json_encoder.encode(envelope)


def detect(data: bytes) -> Format:
    """Tell a JSON envelope from a msgpack one by its first byte."""
    if not data:
        raise DecodeError("empty message")
    first = data[0]
    if first == 0x7B or first in b" \t\r\n":
        return "json"
    if 0x80 <= first <= 0x8F or first in (0xDE, 0xDF):
        return "msgpack"
    raise DecodeError(f"not an envelope: first byte 0x{first:02x}")


def decode(data: bytes, upcasters: Mapping[tuple[str, int], Upcaster] = UPCASTERS, *,
           heads: bool = False) -> Envelope:
    """Decode an envelope from JSON or msgpack, upcasting old schema versions.

    The fast path is one typed decode. Only an envelope written with an older schema version
    (or one whose old shape fails the typed decode) takes the slow path through plain dicts.
    With ``heads``, a :class:`HeadsEnvelope`: a bunch of jobs comes without its specs (skipped
    by the decoder, never made).

    Raises:
        DecodeError: the bytes are not an envelope of a known event and version.

    """
    fmt = detect(data)
    decoder: msgspec.msgpack.Decoder[Any] | msgspec.json.Decoder[Any]
    if heads:
        decoder = _msgpack_heads if fmt == "msgpack" else _json_heads
    else:
        decoder = _msgpack_decoder if fmt == "msgpack" else _json_decoder
    try:
        env: Envelope = decoder.decode(data)
    except (msgspec.ValidationError, ValueError) as typed_error:
        return _decode_slow(data, fmt, upcasters, typed_error, heads)
    if env.schema_version != CURRENT_VERSIONS[env.tag]:
        return _decode_slow(data, fmt, upcasters, None, heads)
    return env


def decode_many(datas: Sequence[bytes],
                upcasters: Mapping[tuple[str, int], Upcaster] = UPCASTERS, *,
                heads: bool = False, bulk: bool = False) -> list[Envelope]:
    """:func:`decode` of each of ``datas``, in order.

    A log's records are almost all msgpack envelopes of current versions: those are decoded
    with the typed decoder in one loop (no format check or call of :func:`decode` per record:
    a third of a replay lane's decode). Only if some record fails that, or is of an older
    version, do those records go through :func:`decode` one by one, which raises its
    :class:`DecodeError` for the first bad one.

    With ``bulk`` (implies ``heads``), the records of that loop are bulk envelopes:
    SJ, MJS and MJC with their resources undecoded, and so unchecked until
    :func:`schemas.envelope.full` or their reader decodes them. Records that take
    :func:`decode` come as with ``heads``.
    """
    heads = heads or bulk
    dec = (_msgpack_bulk if bulk else _msgpack_heads if heads else _msgpack_decoder).decode
    try:
        envs: list[Envelope] = [dec(data) for data in datas]
    except ValueError:  # msgspec's errors are ValueErrors: JSON, or not an envelope
        return [decode(data, upcasters, heads=heads) for data in datas]
    versions = CURRENT_VERSIONS
    for i, env in enumerate(envs):
        if env.schema_version != versions[env.tag]:
            envs[i] = decode(datas[i], upcasters, heads=heads)  # upcast
    return envs


def _decode_slow(
    data: bytes,
    fmt: Format,
    upcasters: Mapping[tuple[str, int], Upcaster],
    typed_error: Exception | None,
    heads: bool = False,
) -> Envelope:
    try:
        raw: Any = (_msgpack_any if fmt == "msgpack" else _json_any).decode(data)
    except msgspec.DecodeError as e:
        raise DecodeError(f"malformed {fmt}: {e}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("event"), dict):
        raise DecodeError(f"not an envelope: {typed_error or 'no event'}")
    tag, version = raw.get("tag"), raw.get("schema_version")
    if tag not in CURRENT_VERSIONS:
        raise DecodeError(f"unknown event tag {tag!r}")
    if not isinstance(version, int):
        raise DecodeError(f"schema_version of {tag!r} is not an integer: {version!r}")
    current = CURRENT_VERSIONS[tag]
    if version == current and typed_error is not None:
        raise DecodeError(f"invalid {tag!r} envelope: {typed_error}") from None
    try:
        raw["event"] = upcast(tag, version, raw["event"], current, upcasters)
        raw["schema_version"] = current
        return msgspec.convert(raw, HeadsEnvelope if heads else Envelope, strict=False)
    except (msgspec.ValidationError, ValueError) as e:
        raise DecodeError(f"invalid {tag!r} envelope (version {version}): {e}") from None
