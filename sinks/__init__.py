"""perftracker_ml.sinks: the store, the sink service, read queries and alert channels.

* :mod:`.service` — ``run_sink(settings, ready_file)``: Kafka -> store, alerts, query API
* :mod:`.client` — ``diagnose(settings, job)`` and ``query(settings, name, **params)``
* :mod:`.store`, :mod:`.schema`, :mod:`.raw` — ClickHouse/chDB access, tables and migrations
* :mod:`.base`, :mod:`.clickhouse`, :mod:`.flusher` — the sink protocol and its ClickHouse implementation
* :mod:`.rows`, :mod:`.decode` — records -> rows (the Python path)
* :mod:`.queries`, :mod:`.api` — named read queries and the local HTTP API serving them
* :mod:`.alerts` — incident lifecycle and channels (webhook, Slack, PagerDuty)
"""
