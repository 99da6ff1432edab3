"""Order sample: paying an order publishes ``OrderPaid`` in one transactional message; points,
logistics and cart services apply it idempotently, each in its own database.  See README.md."""
