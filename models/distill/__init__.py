"""``fastmode distill``: the fast model made from the full one.

The student is the full model with most of its decoder layers removed (``shape``: as many layers as
the planner predicts the fast lane's chips can run at the wanted speed-up), so it shares the full
model's tokenizer, embedding and head and can draft for the exact tier. It is trained on the full
model's own greedy answers to a generated prompt set (``prompts``, ``teacher``), against the full
model's top-k distribution at every answer position (``train``), and written as a checkpoint
that carries only what differs from the full model (``export``; ``assemble`` rebuilds the whole
checkpoint from the two at load time).
"""
