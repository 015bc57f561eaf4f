import pytest
from perftracker_ml.schemas.settings import DetectionSettings, StreamSettings
from perftracker_ml.streams.detect import DetectionPolicy, PolicyError, parse_peer_groups


def test_parse_peer_groups_ranges_and_singles():
    assert parse_peer_groups("a=0-2,5;b=3-4") == {0: "a", 1: "a", 2: "a", 5: "a", 3: "b", 4: "b"}
    assert parse_peer_groups("") == {}


@pytest.mark.parametrize("bad", ["a", "=0-3", "a=x", "a=3-1", "a=0-3;b=2"])
def test_parse_peer_groups_rejects_with_message(bad):
    with pytest.raises(PolicyError, match="peer_groups"):
        parse_peer_groups(bad)


def test_from_settings_copies_same_named_fields():
    detection = DetectionSettings(mad_threshold=4.0, persist_windows=3, peer_groups="a=0-3")
    streams = StreamSettings(window_s=2.0, window_grace_s=1.5, app_id="x")
    p = DetectionPolicy.from_settings(detection, streams)
    assert (p.mad_threshold, p.persist_windows, p.window_ms, p.grace_ms) == (4.0, 3, 2000, 1500)
    assert p.peer_group_map()[3] == "a"


def test_from_settings_real_config_objects():
    p = DetectionPolicy.from_settings(DetectionSettings(), StreamSettings())
    assert p.window_s == 5.0 and p.hang_floor_s == 30.0


def test_from_settings_validates_peer_groups_at_start():
    with pytest.raises(PolicyError):
        DetectionPolicy.from_settings(DetectionSettings(peer_groups="broken"), None)


def test_defaults_are_the_settings_defaults():
    assert DetectionPolicy() == DetectionPolicy.from_settings(DetectionSettings(), StreamSettings())
    assert DetectionPolicy().mad_threshold == DetectionSettings().mad_threshold
    assert DetectionPolicy().window_grace_s == StreamSettings().window_grace_s


def test_policy_error_is_a_config_error():
    from perftracker_ml.schemas.errors import ConfigError, PerftrackerError
    assert issubclass(PolicyError, ConfigError) and issubclass(PolicyError, PerftrackerError)
