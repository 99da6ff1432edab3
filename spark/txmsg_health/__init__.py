"""txmsg_health package."""
