"""Live load against a running vLLM server: the closed-loop client, the level runner of
``kvpressure collect``, and what the server says about its own configuration."""
