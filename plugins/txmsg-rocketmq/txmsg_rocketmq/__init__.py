"""txmsg's RocketMQ backend over the real client (rocketmq-client-python 2.0.0 + librocketmq 2.1.0).

* :mod:`.backend` - ``RocketMQBackend`` (entry point ``txmsg.backends: rocketmq``).
* :mod:`.pool` - N real transaction producers per group, so check-backs run N at a time.
* :mod:`.announce` - first heartbeat of each instance at once (not after librocketmq's 30 s).
* :mod:`.consumer` - push consumers with exception-safe callbacks and DLQ handling.
* :mod:`.gate`, :mod:`.callbacks` - nothing crosses ctypes, nothing shuts down mid-callback.
* :mod:`.messages`, :mod:`.names`, :mod:`.native` - message conversion, names librocketmq can log,
  loading the library (``ROCKETMQ_CLIENT_LOG_DIR`` first).
* :mod:`.doctor` - ``txmsg doctor`` checks.
"""
