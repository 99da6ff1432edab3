"""Fuzz harness of the embedded broker; it lives with the code it fuzzes.

* :mod:`txmsg_broker.fuzz.inputs` - structured input generators and the in-process checks
  (decoders, the server's framing loop) with the exceptions each target may raise;
* :mod:`txmsg_broker.fuzz.live` - one fuzzed connection at a time against a running broker, next
  to a well-behaved client whose messages must all be stored and read back;
* :mod:`txmsg_broker.fuzz.run` - the long mode (``python -m txmsg_broker.fuzz``, also
  ``python -m benchmarks.fuzz_broker``).

``tests/fuzz`` runs the same checks in the suite with hypothesis. Nothing is imported here.
"""
