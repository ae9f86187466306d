"""The wire protocol (a sans-io codec) and the trio transport. Arrives with the network issue."""
