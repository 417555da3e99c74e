"""The gate: one sample trained, exported and served before any long stage, to prove that serving computes what
training computed (a stage of its own, above training, export and serving, which it drives)."""
