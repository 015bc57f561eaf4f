"""The collector's control follower against the real tansu broker."""

import datetime as dt

from perftracker_ml.collectors.control import ControlFollower
from perftracker_ml.collectors.profiling import ProfileRequest
from perftracker_ml.collectors.safety import ErrorBudget
from perftracker_ml.schemas import Codec
from perftracker_ml.schemas.kafka_admin import ensure_topics
from perftracker_ml.schemas.topics import Topic
from perftracker_ml.schemas.vocabulary import CONTROL

from ..waiting import wait_for


class Windows:
    def __init__(self) -> None:
        self.requests: list[ProfileRequest] = []

    def request(self, req: ProfileRequest) -> None:
        self.requests.append(req)

    def request_stop(self) -> None:
        raise AssertionError("no stop was sent")


def produce(conf: dict[str, str], topic: str, job: str, request_id: str) -> None:
    from confluent_kafka import Producer

    msg = {"job": job, "request_id": request_id, "command": "PROFILE", "start_step": 7, "duration_s": 1.0,
           "reason": "test", "issued_ms": dt.datetime.now(dt.timezone.utc)}
    producer = Producer(conf)
    producer.produce(topic, Codec(CONTROL).encode(msg), job.encode())
    assert producer.flush(10) == 0


def test_a_request_read_before_the_job_id_was_agreed_is_taken_after(kafka_conf, unique):
    """A rank starts under a provisional job id and learns the agreed one seconds later; a
    request for the agreed id that it read meanwhile must not be lost."""
    topic = f"control-{unique}"
    ensure_topics(kafka_conf, [Topic(topic, 1, "job", "test")])
    produce(kafka_conf, topic, f"agreed-{unique}", "r1")
    windows = Windows()
    follower = ControlFollower(kafka_conf, topic, f"provisional-{unique}", windows, ErrorBudget())
    follower.start()
    try:
        wait_for(lambda: follower.read >= 1, 30, describe=lambda: follower.read)
        assert windows.requests == []  # another job's, as far as it knew
        follower.set_job(f"agreed-{unique}")
        wait_for(lambda: windows.requests, 30, describe=lambda: (follower.read, follower.received))
        assert windows.requests == [ProfileRequest("r1", 7, 1.0)]
        produce(kafka_conf, topic, f"agreed-{unique}", "r2")  # and it goes on following
        wait_for(lambda: len(windows.requests) == 2, 30, describe=lambda: windows.requests)
        assert follower.received == 2
    finally:
        follower.close()
