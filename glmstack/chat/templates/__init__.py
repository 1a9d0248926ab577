"""The official GLM chat templates, vendored so tests and saved tokenizers need no network.

- glm-4.6.jinja: the `chat_template` of zai-org/GLM-4.6 as vendored by llama.cpp (ggml-org/llama.cpp,
  models/templates/GLM-4.6.jinja, MIT). Style "glm-4.5" (GLM-4.5 renders identically for dict arguments).
- glm-4.7.jinja: the GLM-4.7 / GLM-4.7-Flash template as vendored by a llama.cpp fork
  (models/templates/GLM-4.7-Flash.jinja, MIT). Style "glm-4.7" (GLM-5 uses the same rules).
Byte-identical to the chat_template of zai-org's released tokenizer_config.json files
(tests/parity/test_chat_templates.py checks them against the reference copy in tests/data/reference).
"""
