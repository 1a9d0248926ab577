"""Images and short videos through GLM's chat format, the synthetic visual QA set, and the tiny multimodal recipe
(GLM-4.1V-Thinking / GLM-4.5V, arXiv 2507.01006; docs/multimodal.md). The model half (vision encoder, adapter,
3D-RoPE) lives in glmstack.model; this package is the data, IO and recipe half."""
