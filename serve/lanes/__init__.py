"""The lanes: one Serve deployment class (``Lane``) over two engines that share one async interface
(``LaneEngine``): fastmode's sharded executor (fast lane) and vLLM (priority and standard lanes)."""
