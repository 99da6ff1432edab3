"""Payment -> fee sample: completing a payment publishes PaymentCompleted transactionally; the fee
service computes the merchant fee idempotently.  See README.md."""
