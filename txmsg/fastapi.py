"""FastAPI integration: the app's lifespan runs the TxMsg app, ``Depends`` hands out producers.

::

    from typing import Annotated
    from fastapi import Depends, FastAPI
    from txmsg.fastapi import lifespan, async_transactional_producer

    app = TxMsg(load_config())
    api = FastAPI(lifespan=lifespan(app))
    OrderProducer = Annotated[
        AsyncTransactionalProducer, Depends(async_transactional_producer("order-tx"))
    ]

    @api.post("/orders/{order_id}/pay")
    async def pay(order_id: str, producer: OrderProducer):
        return await producer.send_in_transaction("orders", {"id": order_id}, arg=order_id)

:func:`lifespan` is ``async with app:`` around the FastAPI app's life, on the server's event loop
(so ``async def`` listeners run there), and puts the TxMsg app on ``api.state.txmsg``; the
dependencies read it from the request, so one module can serve several FastAPI apps.  Needs
``pip install 'txmsg[fastapi]'``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request

from txmsg.aio.producer import AsyncProducer, AsyncTransactionalProducer
from txmsg.app import TxMsg
from txmsg.errors import LifecycleError

STATE_ATTRIBUTE = "txmsg"
"""Where :func:`lifespan` puts the TxMsg app: ``api.state.txmsg``."""


def lifespan(
    app: TxMsg,
    *,
    then: Callable[[FastAPI], AbstractAsyncContextManager[Any]] | None = None,
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """A FastAPI ``lifespan``: ``async with app:`` for the server's life, ``api.state.txmsg``
    set to ``app``.  ``then``: your own lifespan, run inside (the TxMsg app is started when it
    begins and still running when it ends)."""

    @asynccontextmanager
    async def run(api: FastAPI) -> AsyncIterator[None]:
        setattr(api.state, STATE_ATTRIBUTE, app)
        async with app:
            if then is None:
                yield
            else:
                async with then(api):
                    yield

    return run


def txmsg_app(request: Request) -> TxMsg:
    """Dependency: the TxMsg app of the FastAPI app serving ``request``.

    Raises:
        LifecycleError: the FastAPI app was not created with ``lifespan=txmsg.fastapi.lifespan(app)``.
    """
    app = getattr(request.app.state, STATE_ATTRIBUTE, None)
    if not isinstance(app, TxMsg):
        raise LifecycleError(
            "this FastAPI app runs no TxMsg app: create it with "
            "FastAPI(lifespan=txmsg.fastapi.lifespan(app))"
        )
    return app


def async_producer(group: str | None = None) -> Callable[[Request], AsyncProducer]:
    """Dependency factory: ``Depends(async_producer("order-tx"))`` gives the group's
    :class:`~txmsg.aio.producer.AsyncProducer` (``None``: the group ``app.producer()`` picks)."""

    def dependency(request: Request) -> AsyncProducer:
        return txmsg_app(request).async_producer(group)

    dependency.__name__ = f"async_producer_{group or 'default'}"
    return dependency


def async_transactional_producer(
    group: str | None = None,
) -> Callable[[Request], AsyncTransactionalProducer]:
    """Dependency factory: ``Depends(async_transactional_producer("order-tx"))`` gives the
    listener group's :class:`~txmsg.aio.producer.AsyncTransactionalProducer` (``None``: the group
    ``app.transactional_producer()`` picks)."""

    def dependency(request: Request) -> AsyncTransactionalProducer:
        return txmsg_app(request).async_transactional_producer(group)

    dependency.__name__ = f"async_transactional_producer_{group or 'default'}"
    return dependency
