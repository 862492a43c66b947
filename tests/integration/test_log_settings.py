from __future__ import annotations

import pytest

from services.common.settings import load_settings


def test_the_log_is_compressed_with_zstd_unless_told_otherwise() -> None:
    assert load_settings({}).log.compression == "zstd"
    assert load_settings({"HS_KAFKA_COMPRESSION": "LZ4"}).log.compression == "lz4"
    assert load_settings({"HS_KAFKA_COMPRESSION": "none"}).log.compression is None
    assert load_settings({"HS_KAFKA_COMPRESSION": ""}).log.compression is None


def test_an_unknown_codec_is_named_in_the_error() -> None:
    with pytest.raises(ValueError, match="HS_KAFKA_COMPRESSION: expected one of none, gzip, "
                                         "snappy, lz4, zstd; got 'brotli'"):
        load_settings({"HS_KAFKA_COMPRESSION": "brotli"})


def test_ingest_sends_at_once_unless_told_to_linger() -> None:
    from services.ingest.__main__ import publisher_settings

    shared = load_settings({"HS_KAFKA_LINGER_MS": "7"}).log
    assert shared.linger_ms == 7  # the other services' producers
    assert publisher_settings(shared, {}).linger_ms == 0
    assert publisher_settings(shared, {"HS_INGEST_LINGER_MS": "3"}).linger_ms == 3
    assert publisher_settings(shared, {"HS_INGEST_LINGER_MS": "3"}).compression == "zstd"
    with pytest.raises(ValueError, match="HS_INGEST_LINGER_MS: expected whole milliseconds; "
                                         "got 'soon'"):
        publisher_settings(shared, {"HS_INGEST_LINGER_MS": "soon"})


def test_a_producer_batch_holds_several_bunches_and_fits_a_request() -> None:
    log = load_settings({}).log
    assert log.max_batch_size >= 3 * 570_000  # three bunches of 1,024 specs at once
    assert load_settings({"HS_KAFKA_MAX_BATCH_SIZE": "65536"}).log.max_batch_size == 65536
    for bad in ("0", str(log.max_request_size + 1)):
        with pytest.raises(ValueError, match=f"HS_KAFKA_MAX_BATCH_SIZE must be 1 to "
                                             f"{log.max_request_size} bytes .*not {bad}"):
            load_settings({"HS_KAFKA_MAX_BATCH_SIZE": bad})
    with pytest.raises(ValueError, match="HS_KAFKA_MAX_BATCH_SIZE"):
        load_settings({"HS_KAFKA_MAX_BATCH_SIZE": "big"})
