"""Ray worker groups, their placement, and the sharding of work across them."""
