"""txmsg_broker package."""
