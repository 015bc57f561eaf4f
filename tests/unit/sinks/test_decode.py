import pytest
from perftracker_ml.deploy.workloads import store_records as samples
from perftracker_ml.schemas import MultiCodec, SchemaError
from perftracker_ml.sinks.decode import RecordDecoder

NAMES = ["FunctionPattern", "RankWindow", "Anomaly"]


def test_fast_path_decodes_like_the_codec_with_epoch_ms_timestamps():
    codec, fast = MultiCodec(NAMES), RecordDecoder(NAMES)
    for name, rec in samples.job_records("j", world=2, windows=1):
        if name in NAMES:
            data = codec.encode(name, rec)
            _, slow = codec.decode(data)
            as_ms = {k: int(v.timestamp() * 1000) if hasattr(v, "timestamp") else v for k, v in slow.items()}
            assert fast.decode(data) == (name, as_ms)


@pytest.mark.parametrize("data", [b"", b"junk", b"\xc3\x01" + b"\x00" * 8 + b"x",
                                  MultiCodec(NAMES).encode("Anomaly", samples.anomaly("j"))[:-5]])
def test_garbage_is_a_schema_error(data):
    with pytest.raises(SchemaError):
        RecordDecoder(NAMES).decode(data)
