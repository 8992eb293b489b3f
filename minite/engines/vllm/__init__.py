"""vLLM backend: the `minite` quantization plugin and the `VLLMSampler` engine.

Kept import-light (no vLLM import here): `layout` and `checkpoint` work without vLLM installed; import
`minite.engines.vllm.engine` / `.plugin` where vLLM is needed.
"""
