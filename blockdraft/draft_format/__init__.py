"""A draft directory as vLLM reads it, and reading one back into a draft: the weight names and shapes vLLM's
loaders accept (contract.py), config.json back into a DraftModelConfig (config_reader.py), mask_embedding.pt
(mask_embedding.py), the causality vLLM gives each layer (causality.py), a speculators checkpoint read as the
same (speculators.py), and the importer that checks a directory against them all and builds the draft
(importer.py). The export writes this format; training starts from it (init_from), serving, the gate and the
eval read it, so it sits below every stage."""
