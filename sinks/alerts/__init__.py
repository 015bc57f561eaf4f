"""perftracker_ml.sinks.alerts: incident notifications.

:mod:`.dispatcher` decides what an Anomaly means to people (open, update,
resolve; rate limits) and fans out to one :mod:`.worker` per channel;
channels (:mod:`.webhook`, :mod:`.slack`, :mod:`.pagerduty`) only format.
"""
