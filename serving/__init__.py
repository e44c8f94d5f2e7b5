"""The serving floor: our engine behind an OpenAI-compatible server (server, protocol, logprobs), and the SUTs that
run elsewhere for LoadGen (an HTTP server at a URL: endpoint; Ray replicas: replicas), opened by hosts.open_sut."""
