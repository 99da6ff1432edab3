"""An asyncio order service: FastAPI on async SQLAlchemy paying orders with a transactional
message, and an async idempotent loyalty service consuming it (issue 27).  See README.md."""
