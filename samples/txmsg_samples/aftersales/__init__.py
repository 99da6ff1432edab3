"""After-sales sample: a liability decision must be applied before the refund of the same order.

The after-sales service publishes ``LiabilityDecided`` -> ``RefundPaid`` -> ``CaseClosed`` with
``send_orderly(..., sharding_key=order_id)``; the settlement service consumes them with an orderly,
idempotent listener; a poison message parks its order, not the queue.  See README.md."""
