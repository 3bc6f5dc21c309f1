"""The model-runtime client shared by the LLM service and Retrieval (docs/architecture.md §2).

`chat` holds the chat-model port (messages, tool calls, completions, generation params);
`client` the OpenAI-compatible client that implements it: wire format, settings,
transport, retries and the circuit breaker; `config` reads its settings from the
environment (LLM_RUNTIME_*).
"""
