"""asyncio support: ``async def`` listeners on the app's event loop and awaitable sends.

See ``docs/guide/async.md``.  :class:`~txmsg.aio.loop.LoopBridge` runs listener coroutines on the
app's loop for the client threads that receive the work; :class:`~txmsg.aio.producer.AsyncProducer`
(``app.async_producer(group)``) and :class:`~txmsg.aio.producer.AsyncTransactionalProducer`
(``app.async_transactional_producer(group)``) send without blocking the loop.  They are re-exported by
:mod:`txmsg`; this package's ``__init__`` imports nothing, so the core can use its small helpers
without a cycle.
"""
