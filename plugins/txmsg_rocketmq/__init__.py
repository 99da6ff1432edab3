"""txmsg_rocketmq package."""
