"""`pora bench`: lean load generators for a node, and the Redis peer (a small RESP
client) they are compared with."""
