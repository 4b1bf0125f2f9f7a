"""The jax-free side of streamtrace: the wire protocol (``wire``), the checkpoint format
(``checkpoints``), the runner of an exported learner (``runtime``) and its ZeroMQ server
(``server``). Needs numpy, IREE's runtime, pyzmq and msgpack only; importing this package
imports nothing."""
