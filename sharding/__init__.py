"""The fast model's executor: plain torch Llama, tensor and pipeline parallel across chips."""
