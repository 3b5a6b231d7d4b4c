"""History: per-interval samples of every slot and device, their retention, and queries over them."""
