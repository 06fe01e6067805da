"""Modules of `ultra3 quantize` (recipes.quantize): the checkpoint, the calibration data, the ModelOpt
recipe, the CPU NVFP4 fallback, the export and its fix-ups, and the report."""
